"""Provider batches on real processes (issue 33): a burst of deferrable jobs becomes a
handful of provider batches and no direct call; a worker SIGKILLed mid-batch and a Temporal
restart mid-batch lose nothing and send nothing twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from projections.domain.lifecycle import JobState
from projections.models import AttemptRecord, DeferredJob, Job, ProviderBatch
from tests.conftest import (
    MockProviderServer,
    Stack,
    eventually,
    free_port,
    provider_settings,
    running_stack,
)
from tests.integration.processes import (
    process_env,
    promptjobs_process,
    temporal_address,
    temporal_on_disk,
)

pytestmark = pytest.mark.postgres


async def behave(mock: MockProviderServer, **behaviour: Any) -> None:
    (await mock.http.put("/mock/batches", json=behaviour)).raise_for_status()


@pytest.fixture
async def reset_batches(mock_provider: MockProviderServer) -> AsyncIterator[None]:
    yield
    await behave(mock_provider)


def batch_settings(
    tmp_path: Path, mock: MockProviderServer, database_url: str, address: str, **more: Any
) -> Any:
    values: dict[str, Any] = {
        "database_url": database_url,
        "temporal_address": address,
        "default_provider": "openai",
        "heartbeat_timeout_s": 2.0,
        "batch_max_wait_s": 2.0,
        "batch_poll_s": 0.3,
    }
    return provider_settings(tmp_path, mock, **{**values, **more})


def worker_env(settings: Any) -> dict[str, str]:
    """A `promptjobs worker`'s environment: the stack's, with the mock as `openai`."""
    return process_env(
        settings,
        **{
            name: getattr(settings, name)
            for name in (
                "openai_base_url",
                "default_provider",
                "batch_max_jobs",
                "batch_max_wait_s",
                "batch_poll_s",
            )
        },
        openai_api_key="mock-key",
    )


async def submit_all(stack: Stack, prompts: list[str]) -> list[str]:
    """Submit every prompt as a deferrable job, 20 at a time."""
    ids: list[str] = []
    for start in range(0, len(prompts), 20):
        accepted = await asyncio.gather(
            *(
                stack.submit(prompt, options={"deferrable": True})
                for prompt in prompts[start : start + 20]
            )
        )
        ids.extend(str(a["job_id"]) for a in accepted)
    return ids


async def all_in(stack: Stack, job_ids: list[str], states: set[str], timeout: float) -> None:
    """Wait until every job is in one of `states` (read from the rows: 500 GETs a poll would
    load the machine more than the jobs do)."""

    async def count() -> int:
        query = select(func.count()).where(
            Job.job_id.in_(job_ids), Job.state.in_([JobState(state) for state in states])
        )
        async with stack.projection.sessions() as session:
            return int((await session.execute(query)).scalar() or 0)

    await eventually(count, lambda n: n == len(job_ids), timeout=timeout, interval=0.5)


async def sent_once(stack: Stack, mock: MockProviderServer, tag: str, jobs: int) -> set[str]:
    """Each job reached the provider exactly once, in a provider batch, never directly; its
    one attempt ran there. The provider batches, as the mock saw them."""
    seen = [r for r in await mock.requests() if tag in r["prompt"]]
    assert all(r.get("batch") for r in seen), "no direct call"
    assert sorted(Counter(r["prompt"] for r in seen).values()) == [1] * jobs
    async with stack.projection.sessions() as session:
        attempts = await session.execute(
            select(func.count(), func.max(AttemptRecord.attempt)).where(
                AttemptRecord.via.like("provider batch %")
            )
        )
        assert tuple(attempts.one()) == (jobs, 1)
    return {str(r["batch"]) for r in seen}


async def sent_apart(stack: Stack, mock: MockProviderServer, tag: str) -> None:
    """Each of the 20 jobs reached the provider once, in a batch; and each provider batch
    the mock holds is one of ours, sent once (the jobs may have been gathered into more
    than one, as they came in on a loaded machine)."""
    batches = await sent_once(stack, mock, tag, 20)
    async with stack.projection.sessions() as session:
        ours = (
            await session.execute(
                select(ProviderBatch.batch_id, ProviderBatch.provider_batch_id).where(
                    ProviderBatch.provider_batch_id.is_not(None)
                )
            )
        ).all()
    assert batches == {provider_id for _, provider_id in ours}
    listed = (await mock.http.get("/v1/batches", params={"limit": 1000})).json()["data"]
    tags = Counter((b["metadata"] or {}).get("promptjobs_batch") for b in listed)
    assert [tags[batch_id] for batch_id, _ in ours] == [1] * len(ours), "none sent twice"


# The burst's gathering wait: its submissions take 10-40 s here.
WAIT_S = 10.0


async def test_a_burst_of_500_deferrable_jobs_is_a_handful_of_provider_batches(
    dev_server: WorkflowEnvironment,
    fresh_pg_database: str,
    tmp_path: Path,
    mock_provider: MockProviderServer,
    reset_batches: None,
) -> None:
    await behave(mock_provider, run_s=2.0)
    settings = batch_settings(
        tmp_path,
        mock_provider,
        fresh_pg_database,
        temporal_address(dev_server),
        batch_max_jobs=200,
        batch_max_wait_s=WAIT_S,
    )
    tag = uuid.uuid4().hex[:8]
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        with promptjobs_process("worker", worker_env(settings), tmp_path / "procs"):
            jobs = await submit_all(stack, [f"burst {i} {tag}" for i in range(500)])
            await all_in(stack, jobs, {"succeeded"}, timeout=240)
        batches = await sent_once(stack, mock_provider, tag, 500)
        gathered = await gathering(stack)
    # Each batch left full, or once its oldest job had waited BATCH_MAX_WAIT_S: so a burst
    # that arrives within the wait is 3 batches, and one that trickles in (a slow machine)
    # at most one more per wait it took.
    assert len(batches) == len(gathered)
    assert sum(size for size, _, _ in gathered) == 500
    for size, waited_s, _ in gathered:
        assert size == 200 or (size < 200 and waited_s >= WAIT_S - 0.1), gathered
    span_s = max(last for _, _, last in gathered)
    assert len(gathered) <= 3 + span_s / WAIT_S, (gathered, span_s)
    print(f"500 jobs deferred over {span_s:.1f} s: batches of {[g[0] for g in gathered]}")


async def gathering(stack: Stack) -> list[tuple[int, float, float]]:
    """Each provider batch: its jobs, how long its oldest had waited when it was claimed, and
    when its newest was deferred (seconds after the first job of all)."""
    query = (
        select(
            ProviderBatch.jobs,
            ProviderBatch.created_at,
            func.min(DeferredJob.deferred_at),
            func.max(DeferredJob.deferred_at),
        )
        .join(DeferredJob, DeferredJob.batch_id == ProviderBatch.batch_id)
        .group_by(ProviderBatch.batch_id, ProviderBatch.jobs, ProviderBatch.created_at)
        .order_by(ProviderBatch.created_at)
    )
    async with stack.projection.sessions() as session:
        rows = (await session.execute(query)).all()
    first = min(row[2] for row in rows)
    return [
        (jobs, (created - oldest).total_seconds(), (newest - first).total_seconds())
        for jobs, created, oldest, newest in rows
    ]


async def test_a_worker_killed_mid_batch_loses_nothing_and_sends_nothing_twice(
    dev_server: WorkflowEnvironment,
    fresh_pg_database: str,
    tmp_path: Path,
    mock_provider: MockProviderServer,
    reset_batches: None,
) -> None:
    await behave(mock_provider, run_s=6.0)
    settings = batch_settings(
        tmp_path, mock_provider, fresh_pg_database, temporal_address(dev_server)
    )
    tag = uuid.uuid4().hex[:8]
    procs = tmp_path / "procs"
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        with promptjobs_process("worker", worker_env(settings), procs) as first:
            jobs = await submit_all(stack, [f"killed {i} {tag}" for i in range(20)])
            await all_in(stack, jobs, {"running"}, timeout=60)
            first.kill()  # SIGKILL, while the provider runs the batch
        with promptjobs_process("worker", worker_env(settings), procs):
            await all_in(stack, jobs, {"succeeded"}, timeout=90)
        await sent_apart(stack, mock_provider, tag)


async def test_a_temporal_restart_mid_batch_loses_nothing_and_sends_nothing_twice(
    fresh_pg_database: str,
    tmp_path: Path,
    mock_provider: MockProviderServer,
    reset_batches: None,
) -> None:
    port = free_port()
    database = tmp_path / "temporal.db"

    async def start_temporal() -> WorkflowEnvironment:
        return await temporal_on_disk(port, database)

    await behave(mock_provider, run_s=8.0)
    address = f"127.0.0.1:{port}"
    settings = batch_settings(tmp_path, mock_provider, fresh_pg_database, address)
    tag = uuid.uuid4().hex[:8]
    env = await start_temporal()
    try:
        client = await Client.connect(address, lazy=True)
        async with running_stack(settings, client, run_worker=False) as stack:
            with promptjobs_process("worker", worker_env(settings), tmp_path / "procs"):
                jobs = await submit_all(stack, [f"restarted {i} {tag}" for i in range(20)])
                await all_in(stack, jobs, {"running"}, timeout=60)
                await env.shutdown()
                await asyncio.sleep(2)
                env = await start_temporal()
                await all_in(stack, jobs, {"succeeded"}, timeout=120)
            await sent_apart(stack, mock_provider, tag)
    finally:
        await env.shutdown()
