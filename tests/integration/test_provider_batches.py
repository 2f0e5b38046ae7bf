"""Deferrable jobs run in their provider's batch API under their own ids and states (issue
33): gathered per provider and model, sent as one provider batch to the mock provider
(which speaks OpenAI's Batch API), settled each from its own line at the batch price, and
sent back to run directly where the batch did not run them."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from sqlalchemy import select
from temporalio.testing import WorkflowEnvironment

from activities import provider_batches
from projections.domain.lifecycle import EventType
from projections.models import DeferredJob, JobEvent
from tests.conftest import (
    MockProviderServer,
    Stack,
    cli_json,
    eventually,
    provider_settings,
    running_stack,
)
from tests.integration.test_structured_output import TICKET

PRICES = """
[models."gpt-batch*"]
input = 1.0
output = 4.0

[models."claude-batch*"]
input = 2.0
output = 8.0
"""


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: what these tests exercise goes through the projector alike on both
    databases; the PostgreSQL paths (the gatherer's SKIP LOCKED claims among them) run in
    test_provider_batches_recovery.py, on real processes."""
    return f"sqlite:///{tmp_path / 'projection.db'}"


async def behave(mock: MockProviderServer, **behaviour: Any) -> None:
    (await mock.http.put("/mock/batches", json=behaviour)).raise_for_status()


@pytest.fixture
async def batching(
    dev_server: WorkflowEnvironment,
    database_url: str,
    tmp_path: Path,
    mock_provider: MockProviderServer,
) -> AsyncIterator[Stack]:
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    settings = provider_settings(
        tmp_path,
        mock_provider,
        database_url=database_url,
        default_provider="openai",
        openai_model="gpt-batch-1",
        anthropic_model="claude-batch-1",
        prices_file=prices,
        batch_max_wait_s=1.0,
        batch_poll_s=0.3,
    )
    await behave(mock_provider, run_s=1.0)
    try:
        async with running_stack(settings, dev_server.client) as stack:
            yield stack
    finally:
        await behave(mock_provider)


async def submit(stack: Stack, prompt: str, **options: Any) -> str:
    accepted = await stack.submit(prompt, options={"deferrable": True, **options})
    return str(accepted["job_id"])


async def attempts(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    response = await stack.http.get(f"/v1/jobs/{job_id}/attempts")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["attempts"]
    return found


async def states(stack: Stack, job_id: str) -> list[str]:
    """The states the job's events went through, in order."""
    query = (
        select(JobEvent.state)
        .where(JobEvent.job_id == job_id, JobEvent.type == EventType.STATE_CHANGED.value)
        .order_by(JobEvent.id)
    )
    async with stack.projection.sessions() as session:
        return [state.value for state in (await session.execute(query)).scalars()]


async def output(stack: Stack, job_id: str) -> str:
    response = await stack.http.get(f"/v1/jobs/{job_id}/output")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["done"], body
    return str(body["text"])


async def test_deferrable_jobs_run_as_one_provider_batch_at_the_batch_price(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    prompts = [f"summarise item {i} {tag}" for i in range(5)]
    jobs = [await submit(batching, prompt) for prompt in prompts]
    queued = await batching.job(jobs[0])
    assert queued["state"] == "queued"

    for job_id in jobs:
        job = await batching.settled(job_id, timeout=30)
        assert job["state"] == "succeeded", job
    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert len(seen) == 5, "each job reached the provider once"
    for job_id, prompt in zip(jobs, prompts, strict=True):
        assert await output(batching, job_id) == await mock_provider.answer(prompt)
    assert all(r.get("batch") for r in seen), "no direct call"
    assert len({r["batch"] for r in seen}) == 1, "one provider batch"

    [attempt] = await attempts(batching, jobs[0])
    assert attempt["outcome"] == "succeeded"
    assert attempt["via"].startswith("provider batch pbatch_")
    assert seen[0]["batch"] in attempt["via"]
    full = (attempt["input_tokens"] * 1.0 + attempt["output_tokens"] * 4.0) / 1e6
    assert attempt["cost_usd"] == pytest.approx(full * 0.5)
    assert (await batching.job(jobs[0]))["cost_usd"] == pytest.approx(full * 0.5)
    assert await states(batching, jobs[0]) == ["queued", "running", "succeeded"]

    # What the operator sees of it.
    listed = await cli_json(batching, "provider-batches", "list")
    [batch] = [b for b in listed["batches"] if b["provider_batch_id"] == seen[0]["batch"]]
    assert (batch["jobs"], batch["state"], batch["provider_status"]) == (5, "ended", "completed")
    assert listed["waiting"] == []


async def test_each_line_fails_as_a_direct_call_would(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    busy = await submit(batching, f"busy {tag} mock:fail=429", max_tokens=50)
    broken = await submit(batching, f"broken {tag} mock:fail=500")
    invalid = await submit(batching, f"invalid {tag} mock:fail=400")

    # A 429 line costs no attempt: the job runs directly at once and succeeds.
    job = await batching.settled(busy, timeout=30)
    assert (job["state"], job["attempt"]) == ("succeeded", 2)
    first, second = await attempts(batching, busy)
    assert first["outcome"] == "rate_limit" and first["via"].startswith("provider batch")
    assert second["outcome"] == "succeeded"
    assert second["via"].startswith("deferrable, run directly: its line in provider batch")

    # A 5xx line spends its attempt and is retried directly.
    job = await batching.settled(broken, timeout=30)
    assert (job["state"], job["attempt"]) == ("succeeded", 2)

    # An invalid request fails the job at once, as a direct call's would.
    job = await batching.settled(invalid, timeout=30)
    assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "provider_4xx", 1)
    assert "provider batch" in job["error_message"]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_unreadable_result_line_costs_only_its_own_job_and_is_counted(
    batching: Stack, mock_provider: MockProviderServer, provider: str
) -> None:
    # Lines cut short (with and without their custom_id), a success without an answer, and
    # a line that comes twice, among good ones: each job is settled from its own line, none
    # is sent again (the provider ran and billed them all), and the batch counts the rest.
    tag = uuid.uuid4().hex[:8]
    prompts = {
        name: f"{name} {tag}" + (f" mock:batch_line={name}" if name != "fine" else "")
        for name in ("fine", "garbled", "anonymous", "empty", "twice")
    }
    before = await submit(batching, f"before {tag}", provider=provider)
    jobs = {
        name: await submit(batching, prompt, provider=provider) for name, prompt in prompts.items()
    }
    after = await submit(batching, f"after {tag}", provider=provider)

    for job_id in (before, jobs["fine"], jobs["twice"], after):
        job = await batching.settled(job_id, timeout=30)
        assert (job["state"], job["attempt"]) == ("succeeded", 1), job
    for name in ("garbled", "anonymous", "empty"):
        job = await batching.settled(jobs[name], timeout=30)
        assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "parse", 1), job
    assert "provider batch" in (await batching.job(jobs["anonymous"]))["error_message"]

    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert len(seen) == 7 and all(r.get("batch") for r in seen), "each job sent once, batched"
    listed = (await cli_json(batching, "provider-batches", "list"))["batches"]
    assert sum(b["unreadable_lines"] for b in listed) == 1
    assert sum(b["duplicate_lines"] for b in listed) == 1
    assert all(b["state"] == "ended" for b in listed)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_send_whose_answer_was_lost_after_the_provider_made_the_batch_makes_one_batch(
    batching: Stack, mock_provider: MockProviderServer, provider: str
) -> None:
    # The provider makes the batch, then answers 500: the retried send finds that batch (by
    # our tag on OpenAI; on Anthropic, made since the send began with as many requests)
    # instead of making a second one that would run and bill every job again.
    await behave(mock_provider, run_s=1.0, fail_after_create=1)
    tag = uuid.uuid4().hex[:8]
    jobs = [await submit(batching, f"lost answer {i} {tag}", provider=provider) for i in range(3)]
    for job_id in jobs:
        job = await batching.settled(job_id, timeout=40)
        assert (job["state"], job["attempt"]) == ("succeeded", 1), job
    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert len(seen) == 3, "each job ran once"
    assert len({r.get("batch") for r in seen}) == 1, "in one provider batch"


async def test_a_provider_without_a_batch_api_runs_deferrable_jobs_directly(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    fake = await submit(batching, f"fake {tag}", provider="fake")
    job = await batching.settled(fake, timeout=30)
    assert job["state"] == "succeeded"
    [attempt] = await attempts(batching, fake)
    assert attempt["via"] == "deferrable, run directly: provider fake has no batch API"

    await behave(mock_provider, supported=False)
    compatible = [await submit(batching, f"compatible {i} {tag}") for i in range(2)]
    for job_id in compatible:
        job = await batching.settled(job_id, timeout=30)
        assert job["state"] == "succeeded"
        [attempt] = await attempts(batching, job_id)
        assert "has no batch API (HTTP 404" in attempt["via"]
    # Once found, the provider is not asked again: the next job runs directly at once.
    later = await submit(batching, f"later {tag}")
    assert (await batching.settled(later, timeout=30))["state"] == "succeeded"
    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert not any(r.get("batch") for r in seen)


async def test_a_job_cancelled_before_its_batch_is_sent_never_reaches_the_provider(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    cancelled = await submit(batching, f"never {tag}")
    kept = await submit(batching, f"kept {tag}")
    assert (await batching.http.post(f"/v1/jobs/{cancelled}/cancel")).status_code == 202
    assert (await batching.settled(kept, timeout=30))["state"] == "succeeded"
    assert (await batching.settled(cancelled))["state"] == "cancelled"
    seen = [r["prompt"] for r in await mock_provider.requests() if tag in r["prompt"]]
    assert seen == [f"kept {tag}"]


async def test_lines_an_expired_batch_did_not_run_run_directly_at_no_attempt(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    # Long enough for a poll to see it run (its jobs `running`) before it expires.
    await behave(mock_provider, run_s=3.0, expire_after=1)
    tag = uuid.uuid4().hex[:8]
    jobs = [await submit(batching, f"expiring {i} {tag}", max_tokens=20) for i in range(3)]
    ran_directly = 0
    for job_id in jobs:
        job = await eventually(
            lambda job_id=job_id: batching.job(job_id),
            lambda j: j["state"] == "succeeded",
            timeout=30,
        )
        tried = await attempts(batching, job_id)
        assert tried[0]["via"].startswith("provider batch"), (job, tried)
        if len(tried) == 2:
            ran_directly += 1
            assert tried[0]["outcome"] == "timeout"
            # The batch's attempt is not charged: the job still had all its attempts.
            assert job["attempt"] == 2
            assert "without running it" in tried[1]["via"]
    assert ran_directly == 2


async def test_a_deferrable_job_waits_for_the_batch_of_its_next_place_with_one(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    """Its own provider has no batch API; its fallback's does: it waits for that batch,
    which is its place from then on (issue 48)."""
    tag = uuid.uuid4().hex[:8]
    fallbacks = [{"provider": "openai", "model": "gpt-batch-2"}]
    job_id = await submit(batching, f"elsewhere {tag}", provider="fake", fallbacks=fallbacks)
    assert (await batching.settled(job_id, timeout=30))["state"] == "succeeded"
    [attempt] = await attempts(batching, job_id)
    assert (attempt["provider"], attempt["model"]) == ("openai", "gpt-batch-2")
    assert attempt["via"].startswith("provider batch"), attempt


async def test_lines_an_expired_batch_did_not_run_move_on_to_the_next_place(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    """As an outage does (issue 48): an expired batch's lines run at the job's next place."""
    await behave(mock_provider, run_s=3.0, expire_after=1)
    tag = uuid.uuid4().hex[:8]
    fallbacks = [{"provider": "anthropic", "model": "claude-batch-1"}]
    jobs = [
        await submit(batching, f"expiring {i} {tag}", max_tokens=20, fallbacks=fallbacks)
        for i in range(3)
    ]
    moved = 0
    for job_id in jobs:
        assert (await batching.settled(job_id, timeout=30))["state"] == "succeeded"
        tried = await attempts(batching, job_id)
        if len(tried) == 2:
            moved += 1
            assert "moved on to its place 1, anthropic/claude-batch-1" in tried[0]["moved_on"]
            assert (tried[1]["provider"], tried[1]["model"]) == ("anthropic", "claude-batch-1")
    assert moved == 2


async def test_lines_under_a_spend_cap_hold_the_batch_price_and_the_rest_run_directly(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    """Issue 48: a batch's lines hold their cost at the batch price as it is sent; the line
    that does not fit the org's cap runs directly, waiting for the cap there."""
    tag = uuid.uuid4().hex[:8]
    prompts = [f"capped {i} {tag}" for i in range(3)]
    # gpt-batch-1: $1 and $4 a million, half in a batch; each line: its prompt's tokens
    # (four characters each) and its 20 max_tokens.
    line_usd = (-(-len(prompts[0]) // 4) * 1.0 + 20 * 4.0) / 1e6 * 0.5
    await batching.projection.store.spend_caps.set_org_cap("acme", 2.5 * line_usd)
    jobs = []
    for prompt in prompts:
        jobs.append(await submit(batching, prompt, max_tokens=20))

    def two_ran_one_waits(found: list[dict[str, Any]]) -> bool:
        ran = [j for j in found if j["state"] == "succeeded"]
        waiting = [j for j in found if "spend cap" in (j["waiting_for"] or "")]
        return len(ran) == 2 and len(waiting) == 1

    await eventually(
        lambda: asyncio.gather(*(batching.job(j) for j in jobs)), two_ran_one_waits, timeout=30
    )
    await batching.projection.store.spend_caps.set_org_cap("acme", None)
    for job_id in jobs:
        assert (await batching.settled(job_id, timeout=30))["state"] == "succeeded"
    via = [(await attempts(batching, job_id))[-1]["via"] for job_id in jobs]
    assert sum(v.startswith("provider batch") for v in via) == 2, via
    assert sum("spend cap" in v for v in via) == 1, via


async def test_a_deferrable_job_outlives_the_ordinary_ceiling(
    dev_server: WorkflowEnvironment,
    database_url: str,
    tmp_path: Path,
    mock_provider: MockProviderServer,
) -> None:
    """Its batch takes longer than an ordinary job's ceiling: neither its workflow nor the
    reconciler ends it `stuck`; it has a ceiling of its own."""
    settings = provider_settings(
        tmp_path,
        mock_provider,
        database_url=database_url,
        default_provider="openai",
        job_ceiling_s=2.0,
        reconciler_interval_s=0.5,
        reconciler_grace_s=0.5,
        batch_max_wait_s=4.0,
        batch_poll_s=0.3,
    )
    async with running_stack(settings, dev_server.client) as stack:
        job_id = await submit(stack, f"slow to gather {uuid.uuid4().hex[:8]}")
        # While it waits to be gathered, its row says so.
        waiting = await eventually(lambda: stack.job(job_id), lambda j: j["waiting_for"])
        assert waiting["state"] == "queued"
        assert waiting["waiting_for"] == (
            "deferrable: waiting for a provider batch of openai/gpt-5.4-mini"
        )
        job = await stack.settled(job_id, timeout=30)
        assert job["waiting_for"] is None
        assert job["state"] == "succeeded", job
        [attempt] = await attempts(stack, job_id)
        assert attempt["via"].startswith("provider batch")


async def test_cancel_after_sending_ends_the_job_at_once_and_discards_its_line(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    await behave(mock_provider, run_s=3.0)
    tag = uuid.uuid4().hex[:8]
    cancelled = await submit(batching, f"cancelled {tag}")
    kept = await submit(batching, f"kept {tag}")
    for job_id in (cancelled, kept):
        await eventually(
            lambda job_id=job_id: batching.job(job_id), lambda j: j["state"] == "running"
        )
    assert (await batching.http.post(f"/v1/jobs/{cancelled}/cancel")).status_code == 202
    job = await eventually(
        lambda: batching.job(cancelled), lambda j: j["state"] != "running", timeout=5
    )
    assert job["state"] == "cancelled"

    assert (await batching.settled(kept, timeout=30))["state"] == "succeeded"
    # Its line ran (the batch was not cancelled for one job): discarded, its tokens kept.
    await eventually(lambda: attempts(batching, cancelled), bool, timeout=10)
    job = await batching.job(cancelled)
    assert (job["state"], job["response_id"]) == ("cancelled", None)
    [attempt] = await attempts(batching, cancelled)
    assert attempt["outcome"] == "succeeded" and attempt["via"].startswith("provider batch")
    assert job["output_tokens"] == attempt["output_tokens"] > 0


async def test_a_provider_batch_whose_jobs_are_all_cancelled_is_cancelled(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    await behave(mock_provider, run_s=30.0)
    tag = uuid.uuid4().hex[:8]
    jobs = [await submit(batching, f"all cancelled {i} {tag}") for i in range(2)]
    for job_id in jobs:
        await eventually(
            lambda job_id=job_id: batching.job(job_id), lambda j: j["state"] == "running"
        )
        assert (await batching.http.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202
    for job_id in jobs:
        assert (await batching.settled(job_id))["state"] == "cancelled"

    async def provider_status() -> str:
        listed = await mock_provider.http.get("/v1/batches", headers={"Authorization": "Bearer k"})
        [batch] = [
            b
            for b in listed.json()["data"]
            if b["metadata"]
            and b["metadata"].get("promptjobs_batch") == await batch_of(batching, jobs[0])
        ]
        return str(batch["status"])

    assert await eventually(provider_status, lambda s: s == "cancelled", timeout=10)
    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert seen == [], "no line ran"


async def batch_of(stack: Stack, job_id: str) -> str:
    async with stack.projection.sessions() as session:
        deferred = await session.get(DeferredJob, job_id)
    assert deferred is not None and deferred.batch_id is not None
    return deferred.batch_id


async def test_anthropic_deferrable_jobs_run_as_a_message_batch(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    fine = [await submit(batching, f"claude {i} {tag}", provider="anthropic") for i in range(3)]
    busy = await submit(batching, f"busy {tag} mock:fail=429", provider="anthropic")
    invalid = await submit(batching, f"invalid {tag} mock:fail=400", provider="anthropic")

    for job_id in fine:
        assert (await batching.settled(job_id, timeout=30))["state"] == "succeeded"
        [attempt] = await attempts(batching, job_id)
        assert attempt["via"].startswith("provider batch") and "msgbatch_" in attempt["via"]
        full = (attempt["input_tokens"] * 2.0 + attempt["output_tokens"] * 8.0) / 1e6
        assert attempt["cost_usd"] == pytest.approx(full * 0.5)
    job = await batching.settled(busy, timeout=30)
    assert (job["state"], job["attempt"]) == ("succeeded", 2)
    job = await batching.settled(invalid, timeout=30)
    assert (job["state"], job["error_kind"]) == ("failed", "provider_4xx")

    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    batched = [r for r in seen if r.get("batch")]
    assert len(batched) == 5 and len({r["batch"] for r in batched}) == 1
    assert [r["prompt"] for r in seen if not r.get("batch")] == [f"busy {tag} mock:fail=429"]
    # The same answer as the mock gives the prompt directly (both APIs answer alike).
    assert await output(batching, fine[0]) == await mock_provider.answer(f"claude 0 {tag}")


async def test_flex_through_the_openai_front_door_runs_in_a_provider_batch(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    """`service_tier: "flex"` on a background response, or on a batch's line, makes the job
    deferrable; a response its caller waits for runs directly (and says `default`)."""
    client = AsyncOpenAI(
        base_url=f"{batching.base_url}/v1", api_key=batching.api_key, max_retries=0
    )
    tag = uuid.uuid4().hex[:8]
    flex = await client.responses.create(
        model="gpt-batch-1", input=f"flex {tag}", background=True, service_tier="flex"
    )
    assert flex.service_tier == "flex"
    waited = await client.responses.create(
        model="gpt-batch-1", input=f"waited {tag}", service_tier="flex"
    )
    assert (waited.status, waited.service_tier) == ("completed", "default")

    line = {
        "custom_id": "line-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-batch-1",
            "messages": [{"role": "user", "content": f"line {tag}"}],
            "service_tier": "flex",
        },
    }
    uploaded = await client.files.create(
        file=("lines.jsonl", io.BytesIO((json.dumps(line) + "\n").encode())), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    done = await eventually(
        lambda: client.responses.retrieve(flex.id), lambda r: r.status == "completed", timeout=30
    )
    assert done.output_text
    finished = await eventually(
        lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed", timeout=30
    )
    assert finished.output_file_id is not None
    [row] = [
        json.loads(x)
        for x in (await client.files.content(finished.output_file_id)).text.splitlines()
    ]
    assert row["response"]["body"]["service_tier"] == "flex"

    seen = {
        r["prompt"]: r.get("batch") for r in await mock_provider.requests() if tag in r["prompt"]
    }
    assert seen[f"flex {tag}"] and seen[f"line {tag}"], "both ran in a provider batch"
    assert seen[f"waited {tag}"] is None, "the waited-for response ran directly"


async def test_a_batch_the_provider_loses_sends_its_jobs_to_run_directly(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    await behave(mock_provider, run_s=30.0)
    tag = uuid.uuid4().hex[:8]
    jobs = [await submit(batching, f"lost {i} {tag}") for i in range(2)]
    for job_id in jobs:
        await eventually(
            lambda job_id=job_id: batching.job(job_id), lambda j: j["state"] == "running"
        )
    # The provider forgets every batch: reading this one is a 404 from now on.
    (await mock_provider.http.post("/mock/reset")).raise_for_status()
    await behave(mock_provider, run_s=30.0)
    for job_id in jobs:
        job = await batching.settled(job_id, timeout=30)
        assert (job["state"], job["attempt"]) == ("succeeded", 2)
        first, second = await attempts(batching, job_id)
        assert first["outcome"] == "timeout" and first["via"].startswith("provider batch")
        assert "was lost at the provider without running it" in second["via"]


async def test_jobs_past_a_batchs_size_limit_wait_for_the_next_batch(
    batching: Stack, mock_provider: MockProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider batch stays under the providers' size limits (BATCH_BYTES, made tiny
    here): a batch takes what fits, at least one job, and the rest go to the next."""
    monkeypatch.setattr(provider_batches, "BATCH_BYTES", 600)
    tag = uuid.uuid4().hex[:8]
    jobs = [await submit(batching, f"sized {i} {tag}") for i in range(3)]
    for job_id in jobs:
        assert (await batching.settled(job_id, timeout=30))["state"] == "succeeded"
    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert len(seen) == 3 and all(r.get("batch") for r in seen)
    assert len({r["batch"] for r in seen}) == 3, "one job a batch"


async def test_a_batch_whose_workflow_was_terminated_goes_on_without_sending_twice(
    batching: Stack, mock_provider: MockProviderServer
) -> None:
    await behave(mock_provider, run_s=5.0)
    tag = uuid.uuid4().hex[:8]
    jobs = [await submit(batching, f"terminated {i} {tag}") for i in range(2)]
    for job_id in jobs:
        await eventually(
            lambda job_id=job_id: batching.job(job_id), lambda j: j["state"] == "running"
        )
    batch_id = await batch_of(batching, jobs[0])
    await batching.client.get_workflow_handle(batch_id).terminate("an operator's mistake")
    for job_id in jobs:
        job = await batching.settled(job_id, timeout=30)
        assert (job["state"], job["attempt"]) == ("succeeded", 1)
    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert len(seen) == 2 and len({r["batch"] for r in seen}) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_line_with_an_output_schema_is_validated_as_it_settles(
    batching: Stack, mock_provider: MockProviderServer, provider: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    schema = {"name": "ticket", "schema": TICKET}
    fits = await submit(batching, f"fits {tag}", provider=provider, output_schema=schema)
    missing = f"misses {tag} mock:json_reply=missing"
    misses = await submit(batching, missing, provider=provider, output_schema=schema)

    job = await batching.settled(fits, timeout=30)
    assert (job["state"], job["attempt"]) == ("succeeded", 1)
    answer = (await batching.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert answer["output_json"] == {"category": "billing", "urgent": True, "tags": ["mock"]}
    [attempt] = await attempts(batching, fits)
    assert attempt["via"].startswith("provider batch")

    # The line's answer missed: charged its attempt, run again directly with the repair turn.
    job = await batching.settled(misses, timeout=30)
    assert (job["state"], job["attempt"]) == ("succeeded", 2)
    first, second = await attempts(batching, misses)
    assert (first["outcome"], first["errors"][0]["path"]) == ("schema_mismatch", "/")
    assert first["via"].startswith("provider batch") and first["cost_usd"] is not None
    assert second["via"].startswith("deferrable, run directly: its line in provider batch")
    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert all(r.get("batch") and r["answer_schema"] for r in seen)
