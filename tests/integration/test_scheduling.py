"""Pickup order on the real dev server: priority, per-org fairness, scheduled prompts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from projections.domain.lifecycle import JobState
from projections.models import Job
from projections.scope import Scope
from promptjobs.settings import Settings
from tests.conftest import Stack, eventually, make_settings, new_worker, parse_time, running_stack
from workflows.prompt_job import PromptJobWorkflow

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

OPERATOR = Scope.operator()
QUICK = {"fake": {"latency_ms": 50}}


async def _all_dispatched(stack: Stack, count: int) -> None:
    async def dispatched() -> int:
        async with stack.projection.sessions() as session:
            stmt = select(func.count()).where(Job.dispatched_at.is_not(None))
            return int((await session.execute(stmt)).scalar() or 0)

    await eventually(dispatched, lambda n: n == count, timeout=30)


async def _start_order(stack: Stack, job_ids: list[str]) -> list[str]:
    """Job ids in the order their first attempt started, once all have settled."""

    async def rows() -> list[Job]:
        return [await stack.projection.store.job(OPERATOR, job_id) for job_id in job_ids]

    jobs = await eventually(rows, lambda js: all(j.state.is_terminal for j in js), timeout=60)
    assert all(job.state is JobState.SUCCEEDED for job in jobs)
    return [job.job_id for job in sorted(jobs, key=lambda j: j.started_at or j.created_at)]


async def _schedule_attempts(settings: Settings, client: Client, job_ids: list[str]) -> None:
    """Run the jobs' workflow tasks on a workflow-only worker until each has its first
    attempt scheduled."""

    async def pending() -> list[int]:
        described = [await client.get_workflow_handle(j).describe() for j in job_ids]
        return [len(d.raw_description.pending_activities) for d in described]

    async with Worker(
        client,
        task_queue=settings.temporal_task_queue,
        workflows=[PromptJobWorkflow],
        no_remote_activities=True,
    ):
        await eventually(pending, lambda counts: all(n >= 1 for n in counts), timeout=30)


async def test_urgent_jobs_jump_a_backlog(dev_server: WorkflowEnvironment, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, worker_max_concurrent_activities=1)
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        routine = [await _submit(stack.http, f"r{i}", priority=100) for i in range(10)]
        urgent = [await _submit(stack.http, f"u{i}", priority=0) for i in range(3)]
        await _all_dispatched(stack, 13)
        await _schedule_attempts(settings, dev_server.client, routine + urgent)
        async with new_worker(settings, dev_server.client, stack.projection):
            order = await _start_order(stack, routine + urgent)
    positions = sorted(order.index(job_id) for job_id in urgent)
    print("urgent jobs started at positions", positions, "of 13")
    assert positions == [0, 1, 2]


@pytest.mark.parametrize(
    "priorities",
    # The seed's proof, then neighbours that Temporal's default five keys would rank the same.
    [[90, 50, 10], [12, 11, 10]],
    ids=["seed-90-50-10", "neighbours-12-11-10"],
)
async def test_every_priority_runs_in_its_own_order(
    dev_server: WorkflowEnvironment, tmp_path: Path, priorities: list[int]
) -> None:
    settings = make_settings(tmp_path, worker_max_concurrent_activities=1)
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        jobs = {p: await _submit(stack.http, f"p{p}", priority=p) for p in priorities}
        await _all_dispatched(stack, len(priorities))
        # Workflow tasks first, with no activity poller: every job's attempt then waits in
        # the activity queue's backlog, where priority orders it. (A poller already waiting
        # would take the first attempt scheduled, whatever its priority.)
        await _schedule_attempts(settings, dev_server.client, list(jobs.values()))
        async with new_worker(settings, dev_server.client, stack.projection):
            order = await _start_order(stack, list(jobs.values()))
    by_job = {job_id: p for p, job_id in jobs.items()}
    print("submitted at", priorities, "ran at", [by_job[j] for j in order])
    assert [by_job[j] for j in order] == sorted(priorities)


async def test_one_orgs_burst_does_not_starve_another(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, worker_max_concurrent_activities=1)
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        async with (
            stack.as_user(await stack.key("org-a", "ann")) as a,
            stack.as_user(await stack.key("org-b", "bob")) as b,
        ):
            burst = [await _submit(a, f"a{i}") for i in range(20)]
            late = [await _submit(b, f"b{i}") for i in range(3)]
        await _all_dispatched(stack, 23)
        async with new_worker(settings, dev_server.client, stack.projection):
            order = await _start_order(stack, burst + late)
    b_positions = sorted(order.index(job_id) for job_id in late)
    last_a = max(order.index(job_id) for job_id in burst)
    print("org-b jobs started at positions", b_positions, "of 23; org-a's last at", last_a)
    # Fair by org: B's three run interleaved with A's burst, not after all twenty.
    assert b_positions[-1] < last_a
    assert b_positions[0] < 10


async def _submit(http: httpx.AsyncClient, prompt: str, priority: int = 50) -> str:
    body = {"prompt": prompt, "priority": priority, "options": QUICK}
    response = await http.post("/v1/prompts", json=body)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["job_id"]
    return job_id


async def test_scheduled_prompt_waits_queued_until_its_time(stack: Stack) -> None:
    at = datetime.now(UTC) + timedelta(seconds=3)
    accepted = await stack.submit("later", scheduled_for=at.isoformat(), options=QUICK)
    job = await stack.job(accepted["job_id"])
    assert job["state"] == "queued" and parse_time(job["scheduled_for"]) == at
    job = await stack.settled(accepted["job_id"], timeout=30)
    assert job["state"] == "succeeded"
    assert parse_time(job["started_at"]) >= at


async def test_scheduled_prompt_cancelled_before_its_time_never_runs(stack: Stack) -> None:
    at = datetime.now(UTC) + timedelta(seconds=60)
    accepted = await stack.submit("never", scheduled_for=at.isoformat(), options=QUICK)
    job_id = accepted["job_id"]
    await _all_dispatched(stack, 1)
    response = await stack.http.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202, response.text
    job = await stack.settled(job_id, timeout=20)
    assert job["state"] == "cancelled"
    assert job["attempt"] == 0 and job["started_at"] is None
    # Temporal runs a start-delayed workflow's first task at once when it is cancelled.
    assert parse_time(job["finished_at"]) < at
    description = await eventually(
        lambda: stack.client.get_workflow_handle(job_id).describe(),
        lambda d: d.status is not None and d.status.name != "RUNNING",
        timeout=20,
    )
    print("workflow of the cancelled scheduled job:", description.status)
