"""The dispatcher and reconciler under the races and faults of issue 22 (items 8 to 11), against the
real dev server, a real worker and SQLite."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowExecutionStatus,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from projections.domain.lifecycle import ErrorKind, JobState
from projections.models import Job
from projections.projector import Transition
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import build_dispatcher
from services.dispatch import Dispatcher
from services.priority import fairness_key
from tests.conftest import Stack, eventually, free_port, make_settings, new_worker, running_stack
from workflows.prompt_job import PromptJobWorkflow, initial_search_attributes

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ALICE = Scope("acme", "alice", "member")
OPERATOR = Scope.operator()


@pytest.fixture
async def quiet_stack(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    """A stack whose own dispatcher scans once at start and then stays out of the way, so a
    test can hold a job in the window between a workflow's start and its record."""
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'projection.db'}",
        dispatcher_interval_s=3600.0,
        reconciler_interval_s=3600.0,
    )
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        # Its one scan, of an empty store, is over long before this (milliseconds; seconds on
        # a loaded machine): a job the test accepts after it stays unstarted.
        await asyncio.sleep(2.0)
        yield stack


def dispatcher_of(stack: Stack, client: Client | None = None, **settings: Any) -> Dispatcher:
    overrides = {"reconciler_grace_s": 0.0, **settings}
    return build_dispatcher(
        stack.settings.model_copy(update=overrides), client or stack.client, stack.projection
    )


async def accept(stack: Stack, scope: Scope = ALICE, **submission: Any) -> Job:
    """A committed job that no dispatcher has started (the store, not the API, accepts it)."""
    body: dict[str, Any] = {"text": "hello", "priority": 50, "max_attempts": 3, "options": {}}
    accepted = await stack.projection.store.submit(scope, Submission(**{**body, **submission}))
    return accepted.job


async def start_unrecorded(stack: Stack, job: Job) -> None:
    """What Dispatcher.start does before it records the start: the workflow runs, the row
    does not know yet."""
    workflow_input = dispatcher_of(stack).workflow_input(job)
    await stack.client.start_workflow(
        PromptJobWorkflow.run,
        workflow_input,
        id=job.job_id,
        task_queue=stack.settings.temporal_task_queue,
        search_attributes=initial_search_attributes(workflow_input),
    )


async def status(stack: Stack, job_id: str) -> WorkflowExecutionStatus | None:
    """The job's workflow status; None while it has no workflow."""
    try:
        return (await stack.client.get_workflow_handle(job_id).describe()).status
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return None
        raise


async def states(stack: Stack, job_id: str) -> list[str]:
    return [e.state.value for e in await stack.projection.store.job_events(OPERATOR, job_id)]


async def event_types(stack: Stack, job_id: str) -> list[str]:
    history = await stack.client.get_workflow_handle(job_id).fetch_history()
    return [EventType.Name(event.event_type) for event in history.events]


# -- item 8: a cancel recorded before the start is recorded still reaches the workflow ----


async def test_cancel_of_a_running_job_whose_start_is_unrecorded_cancels_the_call(
    quiet_stack: Stack,
) -> None:
    stack = quiet_stack
    job = await accept(stack, options={"fake": {"latency_ms": 20_000}})
    async with new_worker(stack.settings, stack.client, stack.projection):
        await start_unrecorded(stack, job)
        await eventually(lambda: stack.job(job.job_id), lambda j: j["state"] == "running")
        assert (await stack.http.post(f"/v1/jobs/{job.job_id}/cancel")).status_code == 202
        # The provider call is cancelled, not left to run its 20 s and be billed.
        await eventually(
            lambda: status(stack, job.job_id),
            lambda s: s is WorkflowExecutionStatus.CANCELED,
            timeout=15,
        )
    assert "EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED" in await event_types(stack, job.job_id)
    assert await states(stack, job.job_id) == ["queued", "running", "cancelled"]


async def test_cancel_of_a_queued_job_whose_start_is_unrecorded_cancels_its_workflow(
    quiet_stack: Stack,
) -> None:
    stack = quiet_stack
    job = await accept(stack)
    await start_unrecorded(stack, job)
    # No start recorded and queued: the API cancels the row at once (no attempt can run).
    assert (await stack.http.post(f"/v1/jobs/{job.job_id}/cancel")).status_code == 202
    assert (await stack.job(job.job_id))["state"] == "cancelled"
    # The start that was on its way is recorded now: the workflow must hear the cancel.
    await dispatcher_of(stack).start(job)
    async with new_worker(stack.settings, stack.client, stack.projection):
        await eventually(
            lambda: status(stack, job.job_id), lambda s: s is WorkflowExecutionStatus.CANCELED
        )
    # No attempt ever ran: the provider was never called.
    assert await states(stack, job.job_id) == ["queued", "cancelled"]


# -- item 9: a restarted workflow continues the count; a failed restart is tried again --


async def _lost_while_running(stack: Stack, attempt: int) -> Job:
    """A job whose workflow is gone (a lost dev server) while attempt `attempt` ran."""
    job = await accept(stack)
    await stack.projection.store.mark_dispatched(job.job_id)
    projector = stack.projection.projector
    for n in range(1, attempt + 1):
        await projector.start_attempt(job.job_id, n, "lost-worker")
        if n < attempt:
            await projector.apply(
                Transition(job.job_id, JobState.QUEUED, n, error_kind=ErrorKind.PROVIDER_5XX)
            )
    return await stack.projection.store.job(OPERATOR, job.job_id)


async def test_a_restarted_workflow_continues_the_attempt_count(quiet_stack: Stack) -> None:
    stack = quiet_stack
    job = await _lost_while_running(stack, attempt=2)
    assert await dispatcher_of(stack).reconciler.reconcile_once() == 1
    async with new_worker(stack.settings, stack.client, stack.projection):
        settled = await stack.settled(job.job_id)
    assert (settled["state"], settled["attempt"]) == ("succeeded", 3)
    events = await stack.projection.store.job_events(ALICE, job.job_id)
    assert [(e.state.value, e.data["attempt"]) for e in events][-3:] == [
        ("queued", 2), ("running", 3), ("succeeded", 3),
    ]  # fmt: skip
    assert events[-3].data["error_kind"] == "worker_crash"


async def test_a_restart_that_fails_is_tried_again_on_the_next_pass(quiet_stack: Stack) -> None:
    stack = quiet_stack
    job = await _lost_while_running(stack, attempt=1)
    unreachable = await Client.connect(f"127.0.0.1:{free_port()}", lazy=True)

    async def gone(_job_id: str) -> None:
        return None

    with pytest.raises(RuntimeError):  # Temporal went away between describe and start
        await dispatcher_of(stack, unreachable).reconciler.reconcile(job, gone)
    assert await dispatcher_of(stack).reconciler.reconcile_once() == 1
    async with new_worker(stack.settings, stack.client, stack.projection):
        settled = await stack.settled(job.job_id)
    assert (settled["state"], settled["attempt"]) == ("succeeded", 2)


# -- item 10: scans page through everything and survive one bad job ----------------------


async def test_a_lost_job_behind_a_full_page_of_scheduled_jobs_is_restarted(
    quiet_stack: Stack,
) -> None:
    stack = quiet_stack
    dispatcher = dispatcher_of(stack)
    later = datetime.now(UTC) + timedelta(hours=1)
    scheduled = [await accept(stack, scheduled_for=later) for _ in range(201)]
    for chunk in range(0, len(scheduled), 20):
        await asyncio.gather(*(dispatcher.start(job) for job in scheduled[chunk : chunk + 20]))
    lost = await _lost_while_running(stack, attempt=1)

    assert await dispatcher.reconciler.reconcile_once() == 1
    assert await status(stack, lost.job_id) is WorkflowExecutionStatus.RUNNING


# SQLite does not enforce the org column's 64 characters; an org passing Temporal's 2 KB
# search attribute value is refused at start (that job's start, and only that job's).
UNSTARTABLE_ORG = "a" * 3000


async def test_a_start_temporal_refuses_ends_the_job_and_stops_nothing_else(
    quiet_stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    stack = quiet_stack
    bad = await accept(stack, Scope(UNSTARTABLE_ORG, "olga"))
    good = await accept(stack)
    lost = await _lost_while_running(stack, attempt=1)
    dispatcher = dispatcher_of(stack, dispatcher_interval_s=0.1, reconciler_interval_s=0.1)
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="promptjobs.dispatch"):
        running = asyncio.create_task(dispatcher.run(stop=stop))
        try:
            await eventually(lambda: status(stack, good.job_id), lambda s: s is not None)
            await eventually(lambda: status(stack, lost.job_id), lambda s: s is not None)
        finally:
            stop.set()
            await running
    # Asking again would get the same refusal: the job ends at once, saying why.
    ended = await stack.projection.store.job(OPERATOR, bad.job_id)
    assert (ended.state, ended.error_kind, ended.attempt) == (JobState.FAILED, ErrorKind.STUCK, 0)
    assert ended.error_message is not None
    assert ended.error_message.startswith("Temporal refused to start the job: ")
    assert "PromptJobOrg" in ended.error_message
    about_bad = [r.getMessage() for r in caplog.records if bad.job_id in r.getMessage()]
    assert len(about_bad) == 1, about_bad
    assert not any("unreachable" in r.getMessage() for r in caplog.records)


class StartRecorder(Interceptor):
    """The client's workflow starts as Temporal receives them: their order and how many
    were on their way at once."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.in_flight = 0
        self.most_at_once = 0

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        recorder = self

        class Recorded(OutboundInterceptor):
            async def start_workflow(self, input: StartWorkflowInput) -> Any:
                recorder.order.append(input.id)
                recorder.in_flight += 1
                recorder.most_at_once = max(recorder.most_at_once, recorder.in_flight)
                try:
                    return await super().start_workflow(input)
                finally:
                    recorder.in_flight -= 1

        return Recorded(next)


def recorded_dispatcher(stack: Stack, max_starts: int) -> tuple[StartRecorder, Dispatcher]:
    """A dispatcher whose workflow starts are recorded as Temporal receives them."""
    recorder = StartRecorder()
    client = Client(
        stack.client.service_client, namespace=stack.client.namespace, interceptors=[recorder]
    )
    return recorder, dispatcher_of(stack, client, dispatcher_max_starts=max_starts)


async def test_a_burst_of_submits_starts_each_workflow_once_the_most_urgent_first(
    quiet_stack: Stack,
) -> None:
    stack = quiet_stack
    recorder, dispatcher = recorded_dispatcher(stack, max_starts=4)
    routine = [await accept(stack, priority=50) for _ in range(24)]
    urgent = [await accept(stack, priority=0) for _ in range(4)]

    for job in routine + urgent:  # as the API hands them over, one request after another
        dispatcher.kick(job)
    assert await dispatcher.scan_once() == 0  # the kicked ones are on their way already

    burst = {job.job_id for job in routine + urgent}
    await eventually(
        lambda: stack.projection.store.undispatched(100),
        lambda jobs: not burst & {job.job_id for job in jobs},
    )
    assert sorted(recorder.order) == sorted(burst)  # each started once
    assert set(recorder.order[:4]) == {job.job_id for job in urgent}
    assert recorder.most_at_once == 4


async def test_one_orgs_burst_does_not_hold_another_orgs_starts_behind_it(
    quiet_stack: Stack,
) -> None:
    stack = quiet_stack
    recorder, dispatcher = recorded_dispatcher(stack, max_starts=2)
    burst = [await accept(stack, Scope("initech", "ida")) for _ in range(20)]
    others = [await accept(stack) for _ in range(4)]

    for job in burst + others:
        dispatcher.kick(job)
    await eventually(lambda: asyncio.sleep(0, len(recorder.order)), lambda n: n == 24)

    # The two orgs take turns: the other org's four are among the first eight starts.
    assert {job.job_id for job in others} <= set(recorder.order[:8])


async def test_an_org_longer_than_a_fairness_key_runs_its_jobs(stack: Stack) -> None:
    # 40 `é` are 80 bytes; Temporal refuses a fairness key over 64.
    org = "é" * 40
    async with stack.as_user(await stack.key(org, "eloise")) as http:
        accepted = (await http.post("/v1/prompts", json={"prompt": "hello"})).json()
        job = await eventually(
            lambda: http.get(f"/v1/jobs/{accepted['job_id']}"),
            lambda r: r.json()["state"] == "succeeded",
        )
    assert job.json()["attempt"] == 1


def test_fairness_keys_fit_temporal_and_tell_orgs_apart() -> None:
    long_orgs = ["é" * 40, "é" * 39 + "e", "x" * 65, "😀" * 64]
    keys = [fairness_key(org) for org in long_orgs]
    assert all(len(key.encode()) <= 64 for key in keys)
    assert len(set(keys)) == len(keys)
    assert keys[0].startswith("é" * 20)
    assert fairness_key("acme") == "acme" and fairness_key("é" * 32) == "é" * 32


# -- item 11: the hard ceiling applies with no worker at all ------------------------------


async def test_with_no_worker_a_queued_job_fails_stuck_at_its_ceiling(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'projection.db'}",
        job_ceiling_s=2.0,
        reconciler_grace_s=0.0,
        reconciler_interval_s=0.2,
    )
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        accepted = await stack.submit("nobody home")
        job = await stack.settled(accepted["job_id"], timeout=30)
        assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "stuck", 0)
        assert "hard ceiling" in job["error_message"]
        # Its workflow, which no worker will ever run, does not stay Running either.
        assert await status(stack, job["job_id"]) is WorkflowExecutionStatus.TERMINATED
