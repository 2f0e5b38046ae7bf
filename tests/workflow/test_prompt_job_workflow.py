"""Every path of PromptJobWorkflow, in seconds, on the time-skipping test server."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment

from activities.adapters.fake import fake_output
from activities.contracts import AdapterCall, SettleResult
from activities.job_activities import JobActivities
from projections.models import Response
from promptjobs.runtime import build_adapters
from tests.conftest import eventually
from tests.workflow.conftest import OWNER, Harness


async def test_job_succeeds_and_persists_the_response(harness: Harness) -> None:
    job = await harness.submit("Write a haiku")
    async with harness.worker():
        result = await harness.run(job)
    assert result.state == "succeeded"
    row = await harness.job(job.job_id)
    assert (row.state.value, row.attempt) == ("succeeded", 1)
    response = await harness.projection.store.response(OWNER, row.response_id or "")
    assert response.text == fake_output("Write a haiku")
    assert await harness.states(job.job_id) == ["queued", "running", "succeeded"]


async def test_retryable_failure_requeues_then_succeeds(harness: Harness) -> None:
    job = await harness.submit(fake={"fail": ["provider_5xx", "timeout"]})
    async with harness.worker():
        result = await harness.run(job)
    assert result.state == "succeeded"
    assert await harness.states(job.job_id) == [
        "queued", "running", "queued", "running", "queued", "running", "succeeded",
    ]  # fmt: skip
    events = await harness.events(job.job_id)
    first_requeue = events[2].data
    assert first_requeue["error_kind"] == "provider_5xx"
    assert first_requeue["attempt"] == 1
    assert first_requeue["next_attempt_at"] is not None
    row = await harness.job(job.job_id)
    assert row.attempt == 3
    assert row.error_kind is None  # a success clears the last attempt's error


async def test_backoff_grows_exponentially(harness: Harness) -> None:
    job = await harness.submit(fake={"fail": ["unknown", "unknown"]})
    async with harness.worker():
        await harness.run(job)
    requeues = [e for e in await harness.events(job.job_id) if e.state.value == "queued"][1:]
    waits = [_wait_s(e.data) for e in requeues]
    assert waits == [pytest.approx(1.0, abs=0.05), pytest.approx(2.0, abs=0.05)]


async def test_retries_exhausted_fails_with_the_last_error(harness: Harness) -> None:
    job = await harness.submit(max_attempts=2, fake={"fail": ["timeout", "provider_5xx"]})
    async with harness.worker():
        result = await harness.run(job)
    assert (result.state, result.error_kind) == ("failed", "provider_5xx")
    row = await harness.job(job.job_id)
    assert (row.state.value, row.attempt, row.error_kind) == ("failed", 2, "provider_5xx")
    assert "provider_5xx" in (row.error_message or "")
    assert await harness.states(job.job_id) == ["queued", "running", "queued", "running", "failed"]


@pytest.mark.parametrize("kind", ["provider_4xx", "parse", "auth"])
async def test_non_retryable_error_fails_at_once(harness: Harness, kind: str) -> None:
    job = await harness.submit(fake={"fail": [kind]})
    async with harness.worker():
        result = await harness.run(job)
    assert (result.state, result.error_kind) == ("failed", kind)
    row = await harness.job(job.job_id)
    assert (row.attempt, row.error_kind) == (1, kind)
    assert await harness.states(job.job_id) == ["queued", "running", "failed"]


async def test_rate_limit_waits_for_retry_after(harness: Harness) -> None:
    job = await harness.submit(fake={"fail": ["rate_limit"], "retry_after_s": 3})
    async with harness.worker():
        result = await harness.run(job)
    assert result.state == "succeeded"
    events = await harness.events(job.job_id)
    requeue, rerun = events[2].data, events[3].data
    assert requeue["error_kind"] == "rate_limit"
    assert _wait_s(requeue) == pytest.approx(3, abs=0.05)
    # Temporal honours the delay exactly: the second attempt starts no earlier.
    assert _at(rerun["updated_at"]) >= _at(requeue["next_attempt_at"])


async def test_rate_limit_without_retry_after_waits_the_default(harness: Harness) -> None:
    job = await harness.submit(fake={"fail": ["rate_limit"]})
    async with harness.worker():
        await harness.run(job)
    requeue = (await harness.events(job.job_id))[2].data
    assert _wait_s(requeue) >= harness.settings.rate_limit_default_s - 0.05


async def test_cancel_queued_job(harness: Harness) -> None:
    job = await harness.submit()
    handle = await harness.start(job)  # no worker yet: the job stays queued
    await handle.cancel()
    async with harness.worker():
        with pytest.raises(WorkflowFailureError) as failure:
            await harness.result(handle)
    assert isinstance(failure.value.cause, CancelledError)
    row = await harness.job(job.job_id)
    assert row.state.value == "cancelled"
    assert row.finished_at is not None
    assert await harness.states(job.job_id) == ["queued", "cancelled"]


async def test_cancel_running_job_discards_the_late_response(harness: Harness) -> None:
    # A long heartbeat timeout means the cancel reaches the activity only at its next
    # heartbeat, after the provider answered: the answer arrives late and must be dropped.
    job = await harness.submit(fake={"latency_ms": 1500})
    async with harness.worker():
        handle = await harness.start(job)
        await eventually(lambda: harness.job(job.job_id), lambda j: j.state.value == "running")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await harness.result(handle)
        row = await harness.job(job.job_id)
        assert row.state.value == "cancelled"
        # Leaving the block shuts the worker down gracefully: the in-flight call finishes
        # and hands its (late) answer back.
    row = await harness.job(job.job_id)
    assert (row.state.value, row.response_id) == ("cancelled", None)
    async with harness.projection.sessions() as session:
        assert await session.get(Response, _response_id(row)) is None
    assert await harness.states(job.job_id) == ["queued", "running", "cancelled"]


async def test_job_past_its_hard_ceiling_fails_stuck(harness: Harness) -> None:
    job = await harness.submit(fake={"fail": ["stuck"]})
    # The test server does not skip time while an activity hangs: a short real ceiling.
    harness.dispatcher.ceiling_s = 3
    async with harness.worker():
        handle = await harness.start(job)
        await eventually(lambda: harness.job(job.job_id), lambda j: j.state.value == "running")
        result = await harness.result(handle)
    assert (result.state, result.error_kind) == ("failed", "stuck")
    row = await harness.job(job.job_id)
    assert (row.state.value, row.error_kind) == ("failed", "stuck")
    await _assert_failed_like_its_row(handle, row)


@pytest.mark.parametrize(
    ("body", "kind", "attempt"),
    [
        ({"fake": {"fail": ["auth"]}}, "auth", 1),
        ({"max_attempts": 2, "fake": {"fail": ["timeout", "provider_5xx"]}}, "provider_5xx", 2),
    ],
    ids=["non_retryable", "exhausted"],
)
async def test_failed_job_ends_its_workflow_failed_with_the_rows_error(
    harness: Harness, body: dict[str, Any], kind: str, attempt: int
) -> None:
    job = await harness.submit(**body)
    async with harness.worker():
        handle = await harness.start(job)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    row = await harness.job(job.job_id)
    assert (row.state.value, row.error_kind, row.attempt) == ("failed", kind, attempt)
    assert failure.value.cause.type == kind  # type: ignore[attr-defined]
    await _assert_failed_like_its_row(handle, row)
    # Readers of results see the settled job, not an error of ours.
    result = await harness.result(handle)
    assert (result.state, result.error_kind, result.error_message) == (
        "failed", kind, row.error_message,
    )  # fmt: skip


async def test_succeeded_and_cancelled_jobs_end_completed_and_canceled(harness: Harness) -> None:
    done, cancelled = await harness.submit(), await harness.submit()
    cancelled_handle = await harness.start(cancelled)  # no worker yet: it stays queued
    await cancelled_handle.cancel()
    async with harness.worker():
        done_handle = await harness.start(done)
        assert (await harness.result(done_handle)).state == "succeeded"
        with pytest.raises(WorkflowFailureError):
            await harness.result(cancelled_handle)
    assert (await done_handle.describe()).status is WorkflowExecutionStatus.COMPLETED
    assert (await cancelled_handle.describe()).status is WorkflowExecutionStatus.CANCELED


async def test_a_restarted_workflow_with_no_attempts_left_fails_worker_crash(
    harness: Harness,
) -> None:
    # The reconciler restarts a job whose workflow was lost while its last attempt ran.
    job = await harness.submit(max_attempts=1)
    await harness.projection.projector.start_attempt(job.job_id, 1, "lost-worker")
    job = await harness.job(job.job_id)
    async with harness.worker():
        result = await harness.run(job)
    row = await harness.job(job.job_id)
    assert (result.state, row.state.value, row.error_kind, row.attempt) == (
        "failed", "failed", "worker_crash", 1,
    )  # fmt: skip


async def _assert_failed_like_its_row(handle: WorkflowHandle[Any, Any], row: Any) -> None:
    """The workflow is Failed, after settling its row, with the row's error kind and message."""
    assert (await handle.describe()).status is WorkflowExecutionStatus.FAILED
    history = await handle.fetch_history()
    types = [EventType.Name(event.event_type) for event in history.events]
    assert types[-1] == "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED"
    assert "EVENT_TYPE_ACTIVITY_TASK_COMPLETED" in types  # settle_job, before the failure
    failure = history.events[-1].workflow_execution_failed_event_attributes.failure
    assert failure.application_failure_info.type == row.error_kind
    assert failure.application_failure_info.non_retryable
    assert failure.message == row.error_message
    try:
        await handle.result()
    except WorkflowFailureError as err:
        assert isinstance(err.cause, ApplicationError)
    else:
        raise AssertionError("the failed job's workflow completed")


async def test_search_attributes_follow_the_job(harness: Harness) -> None:
    job = await harness.submit(max_attempts=2, fake={"fail": ["provider_5xx", "auth"]})
    async with harness.worker():
        handle = await harness.start(job)
        await harness.result(handle)
        attributes = await _attributes(handle)
    assert attributes["PromptJobState"] == "failed"
    assert attributes["PromptJobErrorKind"] == "auth"
    assert attributes["PromptJobAttempt"] == 2
    assert attributes["PromptJobOrg"] == "acme"
    assert attributes["PromptJobPromptId"] == job.prompt_id


async def test_a_quick_job_costs_one_activity_and_no_signal(harness: Harness) -> None:
    # The adapter call settles the success itself, and an attempt reports `running` to its
    # workflow only after a while (5 s): a quick job is one activity and two workflow tasks.
    job = await harness.submit("Write a haiku")
    async with harness.worker():
        handle = await harness.start(job)
        result = await harness.result(handle)
    row = await harness.job(job.job_id)
    assert (result.state, result.response_id) == ("succeeded", row.response_id)
    history = await handle.fetch_history()
    types = [EventType.Name(event.event_type) for event in history.events]
    assert types.count("EVENT_TYPE_ACTIVITY_TASK_SCHEDULED") == 1
    assert "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED" not in types
    # One patch marker (patches-2026-12 stands for every earlier patch), not one per patch:
    # each is an event and a search attribute upsert the Temporal server pays for.
    assert types.count("EVENT_TYPE_MARKER_RECORDED") == 1
    assert len(types) == 14, types
    # The response text lives in the projection only, not in workflow history.
    recorded = b"".join(event.SerializeToString() for event in history.events)
    assert fake_output("Write a haiku").encode() not in recorded
    assert (await _attributes(handle))["PromptJobState"] == "succeeded"


async def test_a_long_call_shows_running_to_operators(harness: Harness) -> None:
    job = await harness.submit(fake={"latency_ms": 3000})
    async with harness.worker(worker_report_running_after_s=1.0):
        handle = await harness.start(job)
        await eventually(
            lambda: _attributes(handle), lambda a: a.get("PromptJobState") == "running"
        )
        assert (await harness.result(handle)).state == "succeeded"


async def test_an_attempt_retried_after_its_success_hands_back_the_settlement(
    harness: Harness,
) -> None:
    # The worker committed the success and died before Temporal heard the attempt complete:
    # Temporal retries it, and the retry must neither call the provider again nor change
    # the job.
    job = await harness.submit()
    async with harness.worker():
        first = await harness.run(job)
    states = await harness.states(job.job_id)
    activities = JobActivities(
        harness.projection.store,
        build_adapters(harness.settings),
        harness.settings.backoff,
    )
    env = ActivityEnvironment()
    env.info = replace(env.info, attempt=2)
    call = AdapterCall(job.job_id, 3, time.time() + 60, settle_success=True)
    outcome = await env.run(activities.call_adapter, call)
    assert outcome.settled == SettleResult(False, "succeeded", first.response_id)
    assert await harness.states(job.job_id) == states
    assert (await harness.job(job.job_id)).attempt == 1


async def _attributes(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    described = await handle.describe()
    return {pair.key.name: pair.value for pair in described.typed_search_attributes}


def _at(value: object) -> datetime:
    return datetime.fromisoformat(str(value))


def _wait_s(row: dict[str, object]) -> float:
    return (_at(row["next_attempt_at"]) - _at(row["updated_at"])).total_seconds()


def _response_id(row: object) -> str:
    from projections.ids import response_id_for

    return response_id_for(row.job_id)  # type: ignore[attr-defined]
