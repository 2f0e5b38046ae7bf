"""Provider rate limits (issue 31), end to end on real processes."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from temporalio.testing import WorkflowEnvironment

from projections import budgets
from projections.models import Job, ProviderBudget
from promptjobs import mock_provider
from tests.conftest import (
    MockProviderServer,
    Stack,
    cli,
    cli_json,
    eventually,
    free_port,
    make_settings,
    parse_time,
    provider_settings,
    running_stack,
)
from tests.integration.processes import promptjobs_process

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True


async def test_the_mock_provider_command_enforces_its_limits(tmp_path: Path) -> None:
    port = free_port()
    args = ("--port", str(port), "--rpm", "2", "--tpm", "1000")
    with promptjobs_process("mock-provider", dict(os.environ), tmp_path, *args) as mock:

        async def printed() -> str:
            return mock.output()

        banner = await eventually(printed, lambda text: "rate limits" in text)
        assert "2 requests and 1000 tokens per sliding minute" in banner
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": "Bearer mock"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            answers = [
                await http.post("/v1/chat/completions", json=body, headers=headers)
                for _ in range(3)
            ]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["1", "0", "0"]
        assert 0 < int(answers[2].headers["retry-after"]) <= 60
        mock.terminate()
        assert await mock.exited() == 0


# -- budgets against the mock in rate-limit mode -------------------------------------------
# The provider's minute is shortened to WINDOW_S on both sides (the mock's sliding window and
# the budgets' draws), so a burst of several windows runs in seconds; the rules are the same.

WINDOW_S = 4.0
# The mock's own window, a second shorter: a draw is taken before its request reaches the
# provider, and on a machine running the suite beside other work the request can take
# longer to get there than the budgets' margin at this window (0.5 s) allows.
MOCK_WINDOW_S = WINDOW_S - 1.0


@pytest.fixture
async def short_window_stack(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose provider budgets count over a window of WINDOW_S."""
    settings = make_settings(tmp_path, budget_window_s=WINDOW_S)
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


@pytest.fixture
async def one_second_stack(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    """A stack whose provider budgets count over a window of 1 s."""
    settings = make_settings(tmp_path, budget_window_s=1.0)
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


@asynccontextmanager
async def limited_mock(**limits: float) -> AsyncIterator[MockProviderServer]:
    """A mock provider of its own, enforcing `limits` (rpm, tpm) from its first request,
    over a window of MOCK_WINDOW_S."""
    port = free_port()
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        mock_provider.run_mock_provider(
            "127.0.0.1",
            port,
            stop=stop,
            on_ready=ready.set,
            limits=mock_provider.Limits(window_s=MOCK_WINDOW_S, **limits),
        )
    )
    await asyncio.wait_for(ready.wait(), 10)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            yield MockProviderServer(url, http)
    finally:
        stop.set()
        await task


async def mock_counts(mock: MockProviderServer) -> tuple[int, int]:
    """Requests the mock received, and how many of them it refused with a 429."""
    seen = (await mock.http.get("/mock/limits")).json()
    return int(seen["requests"]), int(seen["rate_limited"])


async def burst(stack: Stack, provider: str, jobs: int, **body: Any) -> list[dict[str, Any]]:
    accepted = [
        await stack.submit(
            f"burst {i} {uuid.uuid4().hex}",
            options={"provider": provider, "model": "gpt-test"},
            **body,
        )
        for i in range(jobs)
    ]
    return [await stack.settled(a["job_id"], timeout=60) for a in accepted]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_burst_past_the_limit_waits_for_the_budget_instead_of_failing(
    dev_server: WorkflowEnvironment, tmp_path: Path, provider: str
) -> None:
    async with limited_mock(rpm=3) as mock:
        settings = provider_settings(
            tmp_path, mock, dispatcher_interval_s=0.2, budget_window_s=WINDOW_S
        )
        async with running_stack(settings, dev_server.client) as stack:
            await stack.projection.store.budgets.set_limits(
                f"{provider}/gpt-test", 3, None, datetime.now(UTC)
            )
            began = time.monotonic()
            settled = await burst(stack, provider, 9, max_attempts=1)
            took = time.monotonic() - began
            requests, refused = await mock_counts(mock)
    assert [job["state"] for job in settled] == ["succeeded"] * 9
    assert (requests, refused) == (9, 0)
    # Three windows' worth: the first three at once, then three a window.
    assert took >= 2 * WINDOW_S
    assert all(job["attempt"] == 1 for job in settled)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_cold_burst_learns_the_limits_from_the_first_answer(
    dev_server: WorkflowEnvironment, tmp_path: Path, provider: str
) -> None:
    # No budget configured: the first call goes alone, and its answer's headers set the
    # budget every other call then draws on.
    async with limited_mock(rpm=3, tpm=100_000) as mock:
        settings = provider_settings(
            tmp_path, mock, dispatcher_interval_s=0.2, budget_window_s=WINDOW_S
        )
        async with running_stack(settings, dev_server.client) as stack:
            settled = await burst(stack, provider, 7, max_attempts=1)
            [budget] = await stack.projection.store.budgets.standing(datetime.now(UTC))
            requests, refused = await mock_counts(mock)
    assert [job["state"] for job in settled] == ["succeeded"] * 7
    assert (requests, refused) == (7, 0)
    assert (budget.name, budget.learned_rpm, budget.learned_tpm) == (
        f"{provider}/gpt-test",
        3,
        100_000,
    )
    assert (budget.own_rpm, budget.rpm, budget.rate_limited) == (None, 3, 0)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_limits_learned_from_an_answer_naming_a_dated_model_belong_to_the_asked_for_budget(
    dev_server: WorkflowEnvironment, tmp_path: Path, provider: str
) -> None:
    # OpenAI answers gpt-4o-mini as gpt-4o-mini-2024-07-18 (Anthropic resolves its aliases
    # the same way): the limits its headers say are the asked-for budget's, so the probe ends
    # with the first answer and the others run at once, not one a PROBE_FOR (30 s) apiece.
    async with limited_mock(rpm=100, tpm=100_000) as mock:
        settings = provider_settings(tmp_path, mock, dispatcher_interval_s=0.2)
        async with running_stack(settings, dev_server.client) as stack:
            accepted = [
                await stack.submit(
                    f"dated {i} {uuid.uuid4().hex} mock:answer_model=gpt-test-2024-07-18",
                    max_attempts=1,
                    options={"provider": provider, "model": "gpt-test"},
                )
                for i in range(4)
            ]
            settled = [
                await stack.settled(a["job_id"], timeout=budgets.PROBE_FOR.total_seconds() - 5)
                for a in accepted
            ]
            standing = await stack.projection.store.budgets.standing(datetime.now(UTC))
    assert [job["state"] for job in settled] == ["succeeded"] * 4
    assert [(b.name, b.learned_rpm, b.learned_tpm) for b in standing] == [
        (f"{provider}/gpt-test", 100, 100_000)
    ]


async def test_a_job_its_orgs_slots_refuse_takes_no_probe(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # Org acme may run one job at a time and a long call holds it: its next job, the first on
    # a new model, is refused a slot, and must not leave that model's probe taken with no
    # call out, or another org's first call there would wait PROBE_FOR (30 s) for nothing.
    async with limited_mock(rpm=100, tpm=100_000) as mock:
        settings = provider_settings(tmp_path, mock, dispatcher_interval_s=0.2, org_max_running=1)
        async with running_stack(settings, dev_server.client) as stack:
            holding = await stack.submit(
                f"hold {uuid.uuid4().hex} mock:delay_ms=15000",
                max_attempts=1,
                options={"provider": "openai", "model": "gpt-hold"},
            )
            await eventually(
                lambda: stack.job(holding["job_id"]), lambda job: job["state"] == "running"
            )
            refused = await stack.submit(
                f"refused {uuid.uuid4().hex}",
                max_attempts=1,
                options={"provider": "openai", "model": "gpt-new"},
            )

            async def awaiting_slot() -> object:
                async with stack.projection.sessions() as session:
                    return await session.scalar(
                        select(Job.awaiting_slot_since).where(Job.job_id == refused["job_id"])
                    )

            await eventually(awaiting_slot, lambda since: since is not None)
            other = stack.as_user(await stack.key("globex", "bob"))
            accepted = (
                await other.post(
                    "/v1/prompts",
                    json={
                        "prompt": f"other org {uuid.uuid4().hex}",
                        "max_attempts": 1,
                        "options": {"provider": "openai", "model": "gpt-new"},
                    },
                )
            ).json()

            async def row() -> dict[str, Any]:
                return (await other.get(f"/v1/jobs/{accepted['job_id']}")).json()  # type: ignore[no-any-return]

            job = await eventually(
                row,
                lambda job: job["state"] == "succeeded",
                timeout=budgets.PROBE_FOR.total_seconds() - 10,
            )
    assert job["attempt"] == 1


async def test_a_probe_after_a_refused_call_ends_with_its_answer(
    dev_server: WorkflowEnvironment, tmp_path: Path, mock_provider: MockProviderServer
) -> None:
    # A model's first call probes its budget; its answer ends the probe, even one that says no
    # limits. A call the provider refuses (400) forgets the budget, so the next call probes
    # again, and its answer must end that probe too: left taken, every later call on the
    # model waited PROBE_FOR (30 s) for an answer already in.
    settings = provider_settings(tmp_path, mock_provider)
    async with running_stack(settings, dev_server.client) as stack:

        async def run(prompt: str) -> str:
            options = {"provider": "openai", "model": "gpt-probed"}
            accepted = await stack.submit(prompt, max_attempts=1, options=options)
            return str((await stack.settled(accepted["job_id"]))["state"])

        tag = uuid.uuid4().hex
        assert await run(f"first {tag}") == "succeeded"
        assert await run(f"refused {tag} mock:fail=400") == "failed"
        assert await run(f"probes again {tag}") == "succeeded"

        async with stack.projection.sessions() as session:
            probes = await session.scalars(
                select(ProviderBudget.probe_until).where(ProviderBudget.name == "openai/gpt-probed")
            )
            assert [until for until in probes if until is not None] == []


async def test_tenants_cannot_mint_provider_budgets_without_bound(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # Model names the provider refuses (404) leave no budget; past the fleet's cap, a call on
    # a new model runs without one. Every job still runs as it would.
    async with limited_mock(rpm=1000, tpm=1_000_000) as mock:
        settings = provider_settings(
            tmp_path, mock, dispatcher_interval_s=0.2, max_provider_budgets=3
        )
        async with running_stack(settings, dev_server.client) as stack:
            junk = [
                await stack.submit(
                    f"junk {i} {uuid.uuid4().hex} mock:fail=404",
                    max_attempts=1,
                    options={"provider": "openai", "model": f"no-such-model-{i}"},
                )
                for i in range(10)
            ]
            for accepted in junk:
                job = await stack.settled(accepted["job_id"], timeout=30)
                assert (job["state"], job["error_kind"]) == ("failed", "provider_4xx")
            assert await stack.projection.store.budgets.standing(datetime.now(UTC)) == []
            real = [
                await stack.submit(
                    f"real {i} {uuid.uuid4().hex}",
                    max_attempts=1,
                    options={"provider": "openai", "model": f"gpt-real-{i}"},
                )
                for i in range(6)
            ]
            for accepted in real:
                job = await stack.settled(accepted["job_id"], timeout=30)
                assert job["state"] == "succeeded"
            standing = await stack.projection.store.budgets.standing(datetime.now(UTC))
    # A worker reads the budgets every 2 s: a burst may overshoot the cap by what it started
    # before its next read, never by the burst's whole width.
    assert 1 <= len(standing) <= 3 + 2


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_429_pauses_the_budget_and_costs_the_job_no_attempt(
    dev_server: WorkflowEnvironment,
    mock_provider: MockProviderServer,
    tmp_path: Path,
    provider: str,
) -> None:
    settings = provider_settings(tmp_path, mock_provider, dispatcher_interval_s=0.2)
    async with running_stack(settings, dev_server.client) as stack:
        prompt = f"paused {uuid.uuid4().hex} mock:fail=429,429;retry_after=1"
        accepted = await stack.submit(
            prompt, max_attempts=1, options={"provider": provider, "model": "gpt-paused"}
        )

        async def row() -> dict[str, Any]:
            return (await stack.http.get(f"/v1/jobs/{accepted['job_id']}")).json()  # type: ignore[no-any-return]

        waiting = await eventually(row, lambda job: job["error_kind"] == "rate_limit")
        assert waiting["state"] in ("queued", "running")
        assert "not counted against max_attempts" in waiting["error_message"]
        job = await stack.settled(accepted["job_id"], timeout=30)
        [budget] = [
            b
            for b in await stack.projection.store.budgets.standing(datetime.now(UTC))
            if b.name == f"{provider}/gpt-paused"
        ]
        # The operator's table counts attempts as the job does: the 429s spent none.
        listed = (await cli(stack, "jobs", "list")).output
        [row] = [line for line in listed.splitlines() if accepted["job_id"][:12] in line]
        assert "1/1 +2 429" in row, listed
    # Two 429s, each spared: the one attempt it was allowed is the third call.
    assert (job["state"], job["attempt"], job["max_attempts"]) == ("succeeded", 3, 1)
    assert budget.rate_limited == 2
    calls = await mock_provider.requests(prompt)
    assert [c["step"] for c in calls] == [429, 429, "ok"]


async def test_under_a_binding_budget_urgent_work_goes_first_and_old_work_is_not_starved(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # One request a window of 1 s (each draw counts 1.5 s with its margin), on the fake
    # provider, set by the operator; a priority point is worth 20 ms of waiting.
    settings = make_settings(
        tmp_path, dispatcher_interval_s=0.2, priority_aging_s=0.02, budget_window_s=1.0
    )
    async with running_stack(settings, dev_server.client) as stack:
        await stack.projection.store.budgets.set_limits("fake/fake-1", 1, None, datetime.now(UTC))
        filler = await stack.submit("takes the first room")
        await stack.settled(filler["job_id"])
        old = await stack.submit("old, not urgent", priority=90)
        submitted = time.monotonic()
        backlog = [await stack.submit(f"urgent {i}", priority=10) for i in range(4)]
        # A steady urgent load, faster than the budget drains, for 4 s.
        stream: list[tuple[float, dict[str, Any]]] = []
        while time.monotonic() - submitted < 4.0:
            await asyncio.sleep(0.4)
            stream.append((time.monotonic() - submitted, await stack.submit("urgent", priority=10)))
        settled = {
            job["job_id"]: job
            for job in [
                await stack.settled(j["job_id"], timeout=60)
                for j in [old, *backlog, *(s for _, s in stream)]
            ]
        }

        def started(job: dict[str, Any]) -> datetime:
            return parse_time(settled[job["job_id"]]["started_at"])

    assert all(job["state"] == "succeeded" for job in settled.values())
    # Lower numbers first: the backlog submitted after the old job ran before it.
    assert all(started(job) < started(old) for job in backlog)
    # Aging: 80 points at 20 ms a point is 1.6 s; urgent work that came later than that
    # after the old job ranks behind it, however urgent.
    later = [job for at, job in stream if at > 1.8]
    assert later, "the stream should outlast the aging"
    assert all(started(old) < started(job) for job in later)


async def test_operators_set_and_read_budgets_and_a_waiting_job_says_why(
    short_window_stack: Stack,
) -> None:
    stack = short_window_stack
    said = (await cli(stack, "budgets", "set", "fake/fake-1", "--rpm", "1")).output
    assert "fake/fake-1: at most 1 requests a minute, fleet-wide" in said
    first = await stack.submit("takes the room", options={"fake": {"latency_ms": 10}})
    await stack.settled(first["job_id"])
    waiting = await stack.submit("waits")

    async def row() -> dict[str, Any]:
        return await stack.job(waiting["job_id"])

    queued = await eventually(row, lambda job: job["waiting_for"] is not None)
    assert queued["state"] == "queued" and queued["attempt"] == 0
    assert (
        "provider budget fake/fake-1: 1 of 1 requests in the last minute" in (queued["waiting_for"])
    )
    assert parse_time(queued["next_attempt_at"]) > parse_time(queued["created_at"])
    [listed] = await cli_json(stack, "budgets", "list")
    assert (listed["budget"], listed["rpm"], listed["limits_from"]) == (
        "fake/fake-1",
        1,
        "operator",
    )
    assert (listed["requests_last_minute"], listed["waiting"]) == (1, 1)
    assert "fake/fake-1" in (await cli(stack, "budgets", "list")).output
    assert (await cli_json(stack, "status"))["provider_budgets"][0]["waiting"] == 1
    async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
        scraped = (await anonymous.get("/metrics")).text
    assert 'promptjobs_budget_limit{budget="fake/fake-1",unit="requests"} 1.0' in scraped
    assert 'promptjobs_budget_waiting_jobs{budget="fake/fake-1"} 1.0' in scraped
    assert 'promptjobs_budget_used{budget="fake/fake-1",unit="requests"} 1.0' in scraped
    done = await stack.settled(waiting["job_id"], timeout=30)
    assert done["state"] == "succeeded" and done["waiting_for"] is None

    await cli(stack, "budgets", "set", "fake/fake-1", "--learned")
    [listed] = await cli_json(stack, "budgets", "list")
    assert (listed["rpm"], listed["limits_from"]) == (None, None)
    from typer.testing import CliRunner

    from promptjobs.cli import app

    refused = CliRunner().invoke(app, ["budgets", "set", "no-slash", "--rpm", "1"])
    assert refused.exit_code != 0 and "provider/model" in str(refused.exception)


async def test_a_job_larger_than_its_budgets_minute_is_refused_at_submission(stack: Stack) -> None:
    await stack.projection.store.budgets.set_limits("fake/fake-1", None, 100, datetime.now(UTC))
    long = "word " * 120  # 600 characters: about 150 tokens, more than the minute's 100
    refused = await stack.http.post("/v1/prompts", json={"prompt": long})
    assert refused.status_code == 422, refused.text
    problem = refused.json()
    assert problem["code"] == "over_provider_budget"
    assert (problem["budget"], problem["tokens"], problem["tokens_per_minute"]) == (
        "fake/fake-1",
        150,
        100,
    )
    assert "shorten the prompt or lower max_tokens" in problem["detail"]
    # Nothing was accepted; a job that fits is.
    assert (await stack.http.get("/v1/jobs")).json()["jobs"] == []
    fits = await stack.submit("a short one")
    assert (await stack.settled(fits["job_id"]))["state"] == "succeeded"


async def test_under_a_binding_budget_an_org_that_just_used_it_yields_to_another(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # Two requests a window of 1 s, on the fake provider. Org A bursts 10 jobs: 2 run, 8
    # wait. Org B's job, submitted after them, goes before A's waiting ones.
    settings = make_settings(tmp_path, dispatcher_interval_s=0.2, budget_window_s=1.0)
    async with (
        running_stack(settings, dev_server.client) as stack,
        stack.as_user(await stack.key("org-a", "ann")) as a,
        stack.as_user(await stack.key("org-b", "bob")) as b,
    ):
        await stack.projection.store.budgets.set_limits("fake/fake-1", 2, None, datetime.now(UTC))
        burst = [
            (await a.post("/v1/prompts", json={"prompt": f"a{i}"})).json()["job_id"]
            for i in range(10)
        ]

        async def waiting() -> int:
            standing = await stack.projection.store.budgets.standing(datetime.now(UTC))
            return standing[0].waiting if standing else 0

        await eventually(waiting, lambda n: n >= 6)
        b_job = (await b.post("/v1/prompts", json={"prompt": "b"})).json()["job_id"]

        async def done(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
            return await eventually(
                lambda: http.get(f"/v1/jobs/{job_id}"),
                lambda r: r.json()["finished_at"] is not None,
                timeout=60,
            )

        b_row = (await done(b, b_job)).json()
        a_rows = [(await done(a, job_id)).json() for job_id in burst]
    b_started = parse_time(b_row["started_at"])
    after_b = [row for row in a_rows if parse_time(row["started_at"]) > b_started]
    # Of A's 8 that waited, at most the 2 that fit the window B arrived in went before it.
    assert len(after_b) >= 6, [row["started_at"] for row in a_rows]


async def test_an_orgs_token_quota_spaces_its_calls_over_the_minute(
    one_second_stack: Stack,
) -> None:
    # A window of 1 s. The fake provider has no budget; acme's quota of 100 tokens a window
    # holds one call's reservation (its estimate, at most the quota) at a time.
    stack = one_second_stack
    said = (await cli(stack, "orgs", "limit", "acme", "--tpm", "100")).output
    assert "acme: at most 100 tokens a minute on provider budgets" in said
    [acme] = [o for o in await cli_json(stack, "orgs", "list") if o["org"] == "acme"]
    assert acme["tpm"] == 100 and acme["limit_from"] == "PROMPTJOBS_ORG_MAX_RUNNING"
    # About 75 tokens each by the estimate (300 characters), some 120 by the fake's count (a
    # word a token, in and out): no two fit one window.
    jobs = [await stack.submit(f"quota {i} " + "word " * 60) for i in range(3)]

    async def rows() -> list[dict[str, Any]]:
        return [await stack.job(job["job_id"]) for job in jobs]

    waiting = await eventually(rows, lambda now: any(r["waiting_for"] for r in now))
    [reason] = [r["waiting_for"] for r in waiting if r["waiting_for"]][:1]
    assert "org acme's token quota" in reason
    done = [await stack.settled(job["job_id"], timeout=30) for job in jobs]
    assert [job["state"] for job in done] == ["succeeded"] * 3
    starts = sorted(parse_time(job["started_at"]) for job in done)
    # Each call's reservation keeps the next out until it leaves the window (1.5 s held).
    assert all((b - a).total_seconds() >= 1.0 for a, b in itertools.pairwise(starts))
    assert "no token quota" in (await cli(stack, "orgs", "limit", "acme", "--tpm", "0")).output
