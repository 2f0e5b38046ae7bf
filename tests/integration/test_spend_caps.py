"""Issue 48's spend caps, on real processes: a cap holds across three workers on PostgreSQL,
the jobs past it wait naming it and run once it is raised; an org may choose refusals instead
(429, OpenAI's `insufficient_quota` to its SDK); a model without a price cannot slip past a
cap; the operator sets and reads caps with the CLI."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from promptjobs.wiring import open_projection
from tests.conftest import (
    MockProviderServer,
    Stack,
    cli,
    cli_json,
    eventually,
    new_worker,
    provider_settings,
    running_stack,
)

# Each call answers exactly 20 tokens (the mock echoes the prompt's words, cut at max_tokens)
# at $500 a million: $0.01, which is also what each call holds as it starts.
WORDS = " ".join(f"word{i}" for i in range(30))
OPTIONS = {"provider": "openai", "model": "gpt-capped", "max_tokens": 20}
PRICES = '[models."gpt-capped"]\ninput = 0\noutput = 500\n'


def priced(tmp_path: Path, mock: MockProviderServer, **overrides: Any) -> Any:
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    return provider_settings(tmp_path, mock, prices_file=prices, **overrides)


async def submit(stack: Stack, n: int, **body: Any) -> list[str]:
    async def one(i: int) -> str:
        accepted = await stack.http.post(
            "/v1/prompts", json={"prompt": f"{i} {WORDS}", "options": OPTIONS, **body}
        )
        assert accepted.status_code == 202, accepted.text
        job_id: str = accepted.json()["job_id"]
        return job_id

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def states(
    stack: Stack, job_ids: list[str], as_key: str | None = None
) -> list[dict[str, Any]]:
    async with stack.as_user(as_key or stack.api_key) as http:
        return [(await http.get(f"/v1/jobs/{job_id}")).json() for job_id in job_ids]


@pytest.mark.postgres
async def test_a_cap_holds_across_three_workers_and_raising_it_runs_the_rest(
    dev_server: WorkflowEnvironment,
    mock_provider: MockProviderServer,
    tmp_path: Path,
    pg_database: str,
) -> None:
    settings = priced(tmp_path, mock_provider, database_url=pg_database, heartbeat_timeout_s=5.0)
    async with running_stack(settings, dev_server.client) as stack, AsyncExitStack() as workers:
        for _ in range(2):  # three workers in all, each with its own connections
            projection = await workers.enter_async_context(open_projection(settings))
            client = await Client.connect(stack.client.service_client.config.target_host)
            await workers.enter_async_context(new_worker(settings, client, projection))
        await cli(stack, "orgs", "limit", "acme", "--usd-per-day", "0.5")
        job_ids = await submit(stack, 100)

        def parked(jobs: list[dict[str, Any]]) -> bool:
            ran = [j for j in jobs if j["state"] == "succeeded"]
            waiting = [j for j in jobs if "spend cap" in (j.get("waiting_for") or "")]
            return len(ran) + len(waiting) == len(jobs)

        jobs = await eventually(lambda: states(stack, job_ids), parked, timeout=90)
        ran = [j for j in jobs if j["state"] == "succeeded"]
        spent = sum(j["cost_usd"] for j in ran)
        # Each call may cost $0.01 and does: the cap lets exactly fifty run, never more.
        assert len(ran) == 50 and spent == pytest.approx(0.50), (len(ran), spent)
        waiting = [j for j in jobs if j["state"] == "queued"]
        assert "org acme's spend cap: $0.5000 of its $0.50 a day" in waiting[0]["waiting_for"]
        assert "resets" in waiting[0]["waiting_for"]
        [org] = [o for o in await cli_json(stack, "orgs", "list") if o["org"] == "acme"]
        assert (org["usd_per_day"], org["spent_today"], org["held"]) == (0.5, 0.5, 0.0)
        assert org["waiting_on_cap"] == 50 and org["over_cap"] == "wait"
        status = await cli_json(stack, "status")
        assert [c["cap"] for c in status["spend_caps"]] == ["org:acme"]

        await cli(stack, "orgs", "limit", "acme", "--usd-per-day", "5")
        done = await eventually(
            lambda: states(stack, job_ids),
            lambda jobs: all(j["state"] == "succeeded" for j in jobs),
            timeout=60,
        )
        assert sum(j["cost_usd"] for j in done) == pytest.approx(1.0)
        usage = (await stack.http.get("/v1/usage")).json()
        assert usage["today"]["cost_usd"] == pytest.approx(1.0)


async def test_an_org_may_refuse_past_its_cap_and_the_openai_sdk_reads_insufficient_quota(
    dev_server: WorkflowEnvironment, mock_provider: MockProviderServer, tmp_path: Path
) -> None:
    settings = priced(tmp_path, mock_provider)
    async with running_stack(settings, dev_server.client) as stack:
        [first] = await submit(stack, 1)
        assert (await stack.settled(first))["cost_usd"] == pytest.approx(0.01)
        await cli(stack, "orgs", "limit", "acme", "--usd-per-day", "0.01", "--over-cap", "refuse")

        async def refused() -> Any:
            return await stack.http.post("/v1/prompts", json={"prompt": WORDS, "options": OPTIONS})

        answer = await eventually(refused, lambda r: r.status_code == 429, timeout=10)
        problem = answer.json()
        assert problem["code"] == "insufficient_quota" and problem["usd_per_day"] == 0.01
        assert "resets" in problem["detail"] and problem["resets_at"]
        assert int(answer.headers["retry-after"]) > 0

        sdk = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key)
        with pytest.raises(openai.RateLimitError) as raised:
            await sdk.chat.completions.create(
                model="openai/gpt-capped",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=20,
            )
        assert raised.value.code == "insufficient_quota"
        assert raised.value.type == "insufficient_quota"

        # A model the price table does not know cannot slip past the cap.
        unpriced = await stack.http.post(
            "/v1/prompts", json={"prompt": "hi", "options": {**OPTIONS, "model": "gpt-free"}}
        )
        assert unpriced.status_code == 422 and unpriced.json()["code"] == "unpriced_model"
        # The cap removed, the door opens again.
        await cli(stack, "orgs", "limit", "acme", "--usd-per-day", "0")
        await eventually(refused, lambda r: r.status_code == 202, timeout=10)


async def test_a_keys_cap_is_set_with_the_cli_and_binds_that_keys_jobs(
    dev_server: WorkflowEnvironment, mock_provider: MockProviderServer, tmp_path: Path
) -> None:
    settings = priced(tmp_path, mock_provider)
    async with running_stack(settings, dev_server.client) as stack:
        made = await cli_json(
            stack, "keys", "create", "--org", "acme", "--user", "bob", "--usd-per-day", "0.02"
        )
        mine = await submit(stack, 2)  # alice's key: no cap of its own
        async with stack.as_user(made["key"]) as bob:
            theirs = []
            for i in range(4):
                body = {"prompt": f"{i} {WORDS}", "options": OPTIONS}
                theirs.append((await bob.post("/v1/prompts", json=body)).json()["job_id"])
        for job_id in mine:
            assert (await stack.settled(job_id))["state"] == "succeeded"

        def two_ran(jobs: list[dict[str, Any]]) -> bool:
            return [j["state"] for j in jobs].count("succeeded") == 2 and all(
                j["state"] == "succeeded" or "API key" in (j.get("waiting_for") or "") for j in jobs
            )

        await eventually(lambda: states(stack, theirs, made["key"]), two_ran, timeout=30)
        [key] = [k for k in await cli_json(stack, "keys", "list") if k["key_id"] == made["key_id"]]
        assert key["usd_per_day"] == 0.02 and key["used_today"] == pytest.approx(0.02)

        await cli(stack, "keys", "limit", made["key_id"], "--usd-per-day", "0")
        await eventually(
            lambda: states(stack, theirs, made["key"]),
            lambda jobs: all(j["state"] == "succeeded" for j in jobs),
            timeout=30,
        )
