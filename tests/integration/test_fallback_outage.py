"""Issue 48's acceptance for fallbacks, on real processes: two providers, the first stopped
in the middle of a burst of 200 jobs that may fall back to the second. No job fails, every
attempt names where it ran, the first's circuit opens within seconds (attempts stop going
there), and closes once it answers again."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from temporalio.testing import WorkflowEnvironment

from promptjobs.mock_provider import Limits, run_mock_provider
from tests.conftest import (
    MockProviderServer,
    Stack,
    cli_json,
    eventually,
    free_port,
    parse_time,
    provider_settings,
    running_stack,
)

JOBS = 200
OPTIONS = {
    "provider": "openai",
    "model": "gpt-first",
    "fallbacks": [{"provider": "anthropic", "model": "claude-second"}],
}


class StoppableMock:
    """A mock provider of its own, on one port, that can be stopped and started again."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.port = free_port()
        self.limits = limits
        self.admin = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(
            run_mock_provider(
                "127.0.0.1", self.port, stop=self._stop, on_ready=ready.set, limits=self.limits
            )
        )
        await asyncio.wait_for(ready.wait(), 10)

    async def stop(self) -> None:
        assert self._stop is not None and self._task is not None
        self._stop.set()
        await self._task
        self._task = None


async def submit_all(stack: Stack, n: int, tag: str, over_s: float = 0.0) -> list[str]:
    """`n` jobs, all at once, or spread evenly over `over_s` seconds."""

    async def one(i: int) -> str:
        await asyncio.sleep(over_s * i / n)
        body = {"prompt": f"{tag} {i}", "max_attempts": 6, "options": OPTIONS}
        accepted = await stack.http.post("/v1/prompts", json=body)
        assert accepted.status_code == 202, accepted.text
        job_id: str = accepted.json()["job_id"]
        return job_id

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def attempts_of(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    listed = await stack.http.get(f"/v1/jobs/{job_id}/attempts")
    return list(listed.json()["attempts"])


async def test_a_provider_stopped_mid_burst_fails_no_job_and_its_circuit_opens_then_closes(
    dev_server: WorkflowEnvironment, mock_provider: MockProviderServer, tmp_path: Path
) -> None:
    first = StoppableMock()
    await first.start()
    settings = provider_settings(
        tmp_path,
        mock_provider,
        openai_base_url=first.openai_base_url,
        circuit_failures=3,
        circuit_cooldown_s=3.0,
        provider_timeout_s=2.0,
        # 200 jobs on a machine the rest of the suite shares: a slow heartbeat is not a
        # lost worker here (the default 2 s of the tests' settings is).
        heartbeat_timeout_s=5.0,
    )
    try:
        async with running_stack(settings, dev_server.client) as stack:
            before = await submit_all(stack, JOBS // 2, "before")
            await first.stop()
            stopped_at = datetime.now(UTC)
            # Arriving throughout the outage, so that attempts keep coming after it opened.
            during = await submit_all(stack, JOBS // 2, "during", over_s=12.0)
            settled = [await stack.settled(job_id, timeout=120) for job_id in before + during]
            ended = [(j["state"], j["error_kind"], j["error_message"]) for j in settled]
            assert [j["state"] for j in settled].count("succeeded") == JOBS, [
                e for e in ended if e[0] != "succeeded"
            ][:5]

            ran = [await attempts_of(stack, job_id) for job_id in before + during]
            places = {(a["provider"], a["model"]) for job in ran for a in job}
            assert places <= {("openai", "gpt-first"), ("anthropic", "claude-second")}
            # Within seconds of the stop the circuit opened and attempts stopped going to the
            # dead provider: what reached it later are the probes past each cool-down (about
            # one per cool-down for the one worker); the jobs started at the second place,
            # spending nothing, saying so.
            failed_there = [
                a
                for job in ran
                for a in job
                if a["provider"] == "openai" and a["outcome"] != "succeeded"
            ]
            assert failed_there and {a["outcome"] for a in failed_there} == {"provider_5xx"}
            dead = sorted(parse_time(a["started_at"]) for a in failed_there)
            # Seconds a loaded machine may take to count the threshold's failures and let
            # every worker see the circuit open.
            opened_within = 6.0
            late = [t for t in dead if (t - stopped_at).total_seconds() > opened_within]
            outage_s = (dead[-1] - stopped_at).total_seconds()
            assert len(late) <= outage_s / settings.circuit_cooldown_s + 2, (
                [round((t - stopped_at).total_seconds(), 2) for t in dead],
                outage_s,
            )
            skipped = [job for job in ran if job[0]["via"]]
            assert len(skipped) >= JOBS // 4, len(skipped)
            status = await cli_json(stack, "status")
            [circuit] = status["circuits"]
            assert circuit["place"] == "openai/gpt-first" and circuit["opened"] >= 1

            # The provider answers again: past a cool-down the next call finds it and closes
            # the circuit; new jobs run there.
            await first.start()

            async def runs_first_again() -> bool:
                [job_id] = await submit_all(stack, 1, "after")
                job = await stack.settled(job_id, timeout=30)
                return bool(job["state"] == "succeeded") and [
                    a["provider"] for a in await attempts_of(stack, job_id)
                ] == ["openai"]

            await eventually(runs_first_again, bool, timeout=60)
            assert (await cli_json(stack, "status"))["circuits"] == []
    finally:
        with contextlib.suppress(AssertionError):
            await first.stop()


async def test_a_provider_limited_far_below_the_burst_sends_the_overflow_to_the_second(
    dev_server: WorkflowEnvironment, mock_provider: MockProviderServer, tmp_path: Path
) -> None:
    """The first provider lets 10 requests a minute through and says so in its headers (the
    workers learn its budget from the first answer); 40 jobs that may wait 2 s for it."""
    first = StoppableMock(Limits(rpm=10))
    await first.start()
    settings = provider_settings(
        tmp_path,
        mock_provider,
        openai_base_url=first.openai_base_url,
        heartbeat_timeout_s=10.0,
    )
    options = {**OPTIONS, "fallback_after_s": 2}
    try:
        async with running_stack(settings, dev_server.client) as stack:
            accepted = []
            for i in range(40):
                body = {"prompt": f"limited {i}", "options": options}
                answer = await stack.http.post("/v1/prompts", json=body)
                accepted.append(answer.json()["job_id"])
            settled = [await stack.settled(job_id, timeout=120) for job_id in accepted]
            assert {j["state"] for j in settled} == {"succeeded"}
            assert {j["attempt"] for j in settled} == {1}  # moving on spent no attempt

            ran = [(await attempts_of(stack, job_id))[0] for job_id in accepted]
            on_first = sum(a["provider"] == "openai" for a in ran)
            on_second = sum(a["provider"] == "anthropic" for a in ran)
            assert on_first + on_second == 40
            assert 1 <= on_first <= 12 and on_second >= 28, (on_first, on_second)
            seen = (await first.admin.get("/mock/limits")).json()
            assert seen["rate_limited"] <= max(1, 0.02 * seen["requests"]), seen
    finally:
        await first.stop()
