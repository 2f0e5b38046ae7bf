"""Retention runs by itself: a Temporal Schedule that `promptjobs worker` keeps, removing settled
jobs once they are older than PROMPTJOBS_RETENTION_DAYS (issue 22, item 7)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from temporalio.client import (
    ScheduleActionStartWorkflow,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleIntervalSpec,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from activities.contracts import ArchiveExpired
from projections.models import ProviderBatch
from projections.scope import Scope
from services.retention import schedule_id
from tests.conftest import Stack, eventually, make_settings, running_stack
from tests.integration.processes import process_env, promptjobs_process, temporal_address

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

DAY_S = 86_400


async def test_a_worker_keeps_a_schedule_that_removes_jobs_past_the_retention_period(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    retention_s = 6.0
    settings = make_settings(
        tmp_path, database_url=database_url, temporal_address=temporal_address(dev_server)
    )
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        env = process_env(
            stack.settings, retention_days=retention_s / DAY_S, retention_interval_s=1
        )
        with promptjobs_process("worker", env, tmp_path / "procs") as worker:
            await worker.ready()
            handle = dev_server.client.get_schedule_handle(
                schedule_id(stack.settings.temporal_task_queue)
            )
            described = await eventually(lambda: described_or_none(handle), bool)
            assert described is not None
            action = described.schedule.action
            assert isinstance(action, ScheduleActionStartWorkflow)
            assert action.workflow == "ArchiveExpiredJobs"
            assert described.schedule.spec.intervals == [
                ScheduleIntervalSpec(every=timedelta(seconds=1))
            ]

            old = await stack.submit("old")
            await stack.settled(old["job_id"])
            # Gone within the retention period and a run or two after it.
            await eventually(
                lambda: job_status(stack.http, old["job_id"]), lambda code: code == 404,
                timeout=retention_s + 20,
            )  # fmt: skip
            prompt = await stack.http.get(f"/v1/prompts/{old['prompt_id']}")
            assert prompt.status_code == 404

            new = await stack.submit("new")
            assert (await stack.settled(new["job_id"]))["state"] == "succeeded"
            assert await job_status(stack.http, new["job_id"]) == 200

            runs = (await handle.describe()).info.recent_actions
            assert runs, "the schedule has started no run"
        await handle.delete()


async def test_retention_off_deletes_the_schedule(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, temporal_address=temporal_address(dev_server))
    env = process_env(settings, retention_days=30)
    with promptjobs_process("worker", env, tmp_path / "procs") as worker:
        await worker.ready()
        handle = dev_server.client.get_schedule_handle(schedule_id(settings.temporal_task_queue))
        described = await eventually(lambda: described_or_none(handle), bool)
        assert described is not None
        action = described.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        (request,) = action.args
        decode = dev_server.client.data_converter.payload_converter.from_payload
        assert decode(request, ArchiveExpired).retention_days == 30  # type: ignore[arg-type]
    with promptjobs_process("worker", process_env(settings), tmp_path / "procs") as worker:
        await worker.ready()
        await eventually(lambda: described_or_none(handle), lambda d: d is None)


@pytest.mark.parametrize("batch", [1, 2, 500])
async def test_archive_in_batches_removes_the_same_as_at_once(stack: Stack, batch: int) -> None:
    """Three settled jobs, two of them one prompt's (the original and its retry): every batch
    size removes them all, and a prompt goes only with its last job."""
    first = await stack.submit("first")
    await stack.settled(first["job_id"])
    retried = (await stack.http.post(f"/v1/jobs/{first['job_id']}/retry")).json()
    other = await stack.submit("other")
    for job_id in (retried["job_id"], other["job_id"]):
        await stack.settled(job_id)
    removed = 0
    while True:
        done = await stack.projection.store.operations.archive(
            before=datetime.now(UTC) + timedelta(seconds=1), batch=batch
        )
        removed += done.jobs
        if done.jobs < batch:
            break
        # A prompt with a job left is kept, whatever the batch boundary.
        if (await job_status(stack.http, retried["job_id"])) == 200:
            prompt = await stack.http.get(f"/v1/prompts/{first['prompt_id']}")
            assert prompt.status_code == 200
    assert removed == 3
    for job in (first, retried, other):
        assert await job_status(stack.http, job["job_id"]) == 404
    assert (await stack.http.get(f"/v1/prompts/{first['prompt_id']}")).status_code == 404


async def job_status(http: httpx.AsyncClient, job_id: str) -> int:
    return (await http.get(f"/v1/jobs/{job_id}")).status_code


async def described_or_none(handle: ScheduleHandle) -> ScheduleDescription | None:
    try:
        return await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def test_retention_removes_files_batches_and_provider_batches_but_no_active_batchs_input(
    stack: Stack,
) -> None:
    store, owner = stack.projection.store, Scope("acme", "alice")

    async def stored(name: str) -> str:
        made = await store.files.create(
            owner, purpose="batch", filename=name, source=io.BytesIO(b"{}\n"), max_bytes=100
        )
        return made.file_id

    active_input, done_input, loose = await stored("a"), await stored("b"), await stored("c")
    values = {"endpoint": "/v1/chat/completions", "completion_window": "24h", "meta": None}
    later = datetime.now(UTC) + timedelta(days=1)
    active = await store.batches.create(
        owner, {**values, "input_file_id": active_input, "expires_at": later}
    )
    done = await store.batches.create(
        owner, {**values, "input_file_id": done_input, "expires_at": later}
    )
    assert await store.batches.move(done.batch_id, "completed", came_from=("validating",))
    async with stack.projection.sessions() as session:
        now = datetime.now(UTC)
        for batch_id, ended in (("pbatch_ended", now), ("pbatch_running", None)):
            session.add(
                ProviderBatch(
                    batch_id=batch_id,
                    provider="openai",
                    model="m",
                    state="ended" if ended else "sent",
                    jobs=0,
                    workflow_started=True,
                    unreadable_lines=0,
                    duplicate_lines=0,
                    created_at=now,
                    ended_at=ended,
                )
            )
        await session.commit()

    removed = await store.operations.archive_storage(
        before=datetime.now(UTC) + timedelta(seconds=1)
    )

    assert (removed.files, removed.batches, removed.provider_batches) == (2, 1, 1)
    assert [b.batch_id for b in await store.provider_batches.recent(10)] == ["pbatch_running"]
    assert [
        f.file_id for f in await store.files.page(owner, limit=10, after=None, purpose=None)
    ] == [active_input]
    assert [b.batch_id for b in await store.batches.page(owner, limit=10, after=None)] == [
        active.batch_id
    ]
    assert loose != active_input
