"""PromptJobWorkflow: one job's lifecycle from queued to a terminal state."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    TimeoutError,
    TimeoutType,
)

with workflow.unsafe.imports_passed_through():
    from activities.contracts import (
        ATTEMPT_REPORTED,
        JOB_CLOSED,
        AdapterCall,
        AdapterOutcome,
        AttemptReport,
        FinalizeSuccess,
        SettleJob,
        SettleResult,
    )
    from activities.errors import NON_RETRYABLE_TYPES, ErrorKind
    from activities.job_activities import JobActivities
    from projections.states import JobState
    from workflows import search_attributes as sa
    from workflows.contracts import PromptJobInput, PromptJobResult

# Projection writes are short and must land: retry them until they do.
PROJECTION_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10)
)
PROJECTION_TIMEOUT = timedelta(seconds=30)

KINDS = frozenset(kind.value for kind in ErrorKind)

# Since this patch the adapter call settles a success itself (one activity per job, not two);
# histories recorded before it call finalize_success (docs/workflow-versioning.md).
SETTLE_SUCCESS_IN_CALL = "settle-success-in-call"
# Since this patch a job that ends failed ends its workflow Failed, after its row is settled,
# so the Web UI, `ExecutionStatus="Failed"` and Temporal's failure metrics count it; before
# it the workflow completed with a result saying "failed".
FAIL_FAILED_JOBS = "fail-failed-jobs"


def initial_search_attributes(job: PromptJobInput) -> TypedSearchAttributes:
    """What a job's workflow carries from its start, so the Web UI can find it."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(sa.JOB_STATE, "queued"),
            SearchAttributePair(sa.ORG, job.org),
            SearchAttributePair(sa.PROMPT_ID, job.prompt_id),
            SearchAttributePair(sa.PRIORITY, job.priority),
            SearchAttributePair(sa.ATTEMPT, job.attempts_before),
        ]
    )


@workflow.defn
class PromptJobWorkflow:
    def __init__(self) -> None:
        self._attempt = 0
        self._fail_failed = False

    @workflow.run
    async def run(self, job: PromptJobInput) -> PromptJobResult:
        settle_in_call = workflow.patched(SETTLE_SUCCESS_IN_CALL)
        self._fail_failed = workflow.patched(FAIL_FAILED_JOBS)
        self._attempt = job.attempts_before
        if job.attempts_before >= job.max_attempts:
            # Restarted after its workflow was lost during the last attempt: that attempt is
            # spent, as a worker lost during it would have spent it (docs/decisions.md).
            message = f"attempt {job.attempts_before} was lost with its workflow; none left"
            return await self._fail(job, ErrorKind.WORKER_CRASH, message)
        try:
            outcome = await self._call_adapter(job, settle_in_call)
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                # The workflow was cancelled; the activity's cancellation surfaces here.
                await self._cancel(job)
                raise asyncio.CancelledError() from err
            if isinstance(err.cause, ApplicationError) and err.cause.type == JOB_CLOSED:
                return self._closed(job, err.cause)
            kind, message = failure_of(err)
            return await self._fail(job, kind, message)
        except asyncio.CancelledError:
            await self._cancel(job)
            raise
        if outcome.settled is not None:
            return self._succeeded(job, outcome, outcome.settled)
        try:
            return await self._succeed(job, outcome)
        except asyncio.CancelledError:
            await self._cancel(job)
            raise

    @workflow.signal(name=ATTEMPT_REPORTED)
    def attempt_reported(self, report: AttemptReport) -> None:
        """An attempt started or was re-queued (the projection already has it)."""
        if report.attempt < self._attempt:
            return
        self._attempt = report.attempt
        self._show(report.state, report.error_kind)

    def _show(self, state: str, error_kind: str | None = None) -> None:
        updates: list[SearchAttributeUpdate[Any]] = [
            sa.JOB_STATE.value_set(state),
            sa.ATTEMPT.value_set(self._attempt),
        ]
        if error_kind is not None:
            updates.append(sa.ERROR_KIND.value_set(error_kind))
        workflow.upsert_search_attributes(updates)
        details = f"{state}, attempt {self._attempt}"
        workflow.set_current_details(details + (f", last error {error_kind}" if error_kind else ""))

    async def _call_adapter(self, job: PromptJobInput, settle_success: bool) -> AdapterOutcome:
        deadline = workflow.now() + timedelta(seconds=job.ceiling_s)
        return await workflow.execute_activity_method(
            JobActivities.call_adapter,
            AdapterCall(
                job.job_id,
                job.max_attempts,
                deadline.timestamp(),
                settle_success,
                attempt_offset=job.attempts_before,
            ),
            schedule_to_close_timeout=timedelta(seconds=job.ceiling_s),
            start_to_close_timeout=timedelta(seconds=job.attempt_timeout_s),
            heartbeat_timeout=timedelta(seconds=job.heartbeat_timeout_s),
            # Delays come from the activity (next_retry_delay, by error kind); this interval
            # only applies to a lost worker, which is retried at once (the server's 1 s floor).
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                backoff_coefficient=1.0,
                maximum_attempts=job.max_attempts - job.attempts_before,
                non_retryable_error_types=[*NON_RETRYABLE_TYPES, JOB_CLOSED],
            ),
        )

    async def _succeed(self, job: PromptJobInput, outcome: AdapterOutcome) -> PromptJobResult:
        settled: SettleResult = await workflow.execute_activity_method(
            JobActivities.finalize_success,
            FinalizeSuccess(job.job_id, outcome),
            start_to_close_timeout=PROJECTION_TIMEOUT,
            retry_policy=PROJECTION_RETRY,
        )
        return self._succeeded(job, outcome, settled)

    def _succeeded(
        self, job: PromptJobInput, outcome: AdapterOutcome, settled: SettleResult
    ) -> PromptJobResult:
        self._attempt = max(self._attempt, outcome.attempt)
        self._show(settled.state)
        return PromptJobResult(job.job_id, settled.state, settled.response_id)

    async def _fail(self, job: PromptJobInput, kind: ErrorKind, message: str) -> PromptJobResult:
        settled = await self._settle(SettleJob(job.job_id, JobState.FAILED, kind.value, message))
        if settled.attempt is not None:
            self._attempt = max(self._attempt, settled.attempt)
        self._show(settled.state, settled.error_kind or kind.value)
        if self._fail_failed and settled.state == JobState.FAILED:
            # The row is settled; now the workflow tells the same story (whatever settled it).
            raise job_failure(settled.error_kind or kind.value, settled.error_message or message)
        return PromptJobResult(job.job_id, settled.state, error_kind=kind.value)

    def _closed(self, job: PromptJobInput, closed: ApplicationError) -> PromptJobResult:
        """The job was settled before this attempt could start (by a cancel, or `stuck` by
        the reconciler): nothing to run. A failed row fails the workflow, as `_fail` does."""
        if self._fail_failed and len(closed.details) == 3:
            state, kind, message = closed.details
            if state == JobState.FAILED and kind is not None:
                self._show(state, kind)
                raise job_failure(kind, message or "")
        return PromptJobResult(job.job_id, "closed")

    async def _cancel(self, job: PromptJobInput) -> None:
        settled = await self._settle(SettleJob(job.job_id, JobState.CANCELLED))
        self._show(settled.state)

    async def _settle(self, settle: SettleJob) -> SettleResult:
        settled: SettleResult = await workflow.execute_activity_method(
            JobActivities.settle_job,
            settle,
            start_to_close_timeout=PROJECTION_TIMEOUT,
            retry_policy=PROJECTION_RETRY,
        )
        return settled


def job_failure(kind: str, message: str) -> ApplicationError:
    """How a failed job ends its workflow: the type is the error kind, the message the row's
    error message. Not benign: Temporal's failure metrics are meant to count it."""
    return ApplicationError(message, type=kind, non_retryable=True)


def failure_of(err: ActivityError) -> tuple[ErrorKind, str]:
    """The error kind of an adapter call that Temporal gave up on."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in KINDS:
        return ErrorKind(cause.type), cause.message
    if isinstance(cause, TimeoutError):
        if cause.type is TimeoutType.HEARTBEAT:
            return ErrorKind.WORKER_CRASH, "the worker stopped heartbeating during the call"
        if cause.type is TimeoutType.SCHEDULE_TO_CLOSE:
            return ErrorKind.STUCK, "the job passed its hard ceiling"
        if cause.type is TimeoutType.START_TO_CLOSE:
            return ErrorKind.TIMEOUT, "the adapter call passed its time limit"
    return ErrorKind.UNKNOWN, str(cause or err)
