"""PromptJobWorkflow: one job's lifecycle from queued to a terminal state."""

from __future__ import annotations

import asyncio
import builtins
from datetime import datetime, timedelta
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
)

with workflow.unsafe.imports_passed_through():
    # Not `from workflows import search_attributes`: a submodule named in a from-list is
    # imported by importlib itself, past the sandbox's passthrough, so every workflow
    # loaded and ran the module afresh (~1.4 ms each; docs/decisions.md).
    import workflows.search_attributes as sa
    from activities.contracts import (
        ATTEMPT_REPORTED,
        BATCH_DONE,
        JOB_CLOSED,
        ORG_BUSY,
        PARENTS_CHANGED,
        PROVIDER_BUSY,
        SLOT_FREED,
        AdapterCall,
        AdapterOutcome,
        AttemptReport,
        BatchVerdict,
        CheckParents,
        DeferJob,
        Deferral,
        FinalizeSuccess,
        ParentsCheck,
        SettleJob,
        SettleResult,
    )
    from activities.deferral import DeferralActivities
    from activities.job_activities import JobActivities
    from projections.domain.lifecycle import (
        NON_RETRYABLE_TYPES,
        TIMEOUT_KINDS,
        ErrorKind,
        JobState,
        kind_of_error_type,
    )
    from workflows.contracts import Direct, PromptJobInput, PromptJobResult

# Projection writes are short and must land: retry them until they do.
PROJECTION_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10)
)
PROJECTION_TIMEOUT = timedelta(seconds=30)

# Since this patch the adapter call settles a success itself (one activity per job, not two);
# histories recorded before it call finalize_success (docs/workflow-versioning.md).
SETTLE_SUCCESS_IN_CALL = "settle-success-in-call"
# Since this patch a job that ends failed ends its workflow Failed, after its row is settled,
# so the Web UI, `ExecutionStatus="Failed"` and Temporal's failure metrics count it; before
# it the workflow completed with a result saying "failed".
FAIL_FAILED_JOBS = "fail-failed-jobs"

# Since this patch a chain's child waits for its parents (a signal, re-checked by an activity)
# before its first attempt; only inputs with `after` take the path (docs/decisions.md).
WAIT_FOR_PARENTS = "wait-for-parents"

# Since this patch a job's first attempt must take one of its org's running slots; refused
# (ORG_BUSY), the workflow waits for SLOT_FREED or this long, then asks again
# (projections/admission.py, docs/decisions.md).
ORG_RUNNING_LIMIT = "org-running-limit"
SLOT_RECHECK = timedelta(seconds=30)

# Since this patch an attempt must also fit its provider budget (projections/budgets.py);
# refused (PROVIDER_BUSY), or answered 429, the workflow waits for SLOT_FREED or the time
# the room is expected, then asks again, and a 429'd attempt is not counted against
# max_attempts (docs/decisions.md).
PROVIDER_BUDGETS = "provider-budgets"

# Since this patch a deferrable job (`options.deferrable`) of a provider with a batch API
# waits queued for its provider batch (workflows/provider_batch.py) to settle it or send it
# back to run directly (BATCH_DONE); only inputs with `deferrable` take the path.
PROVIDER_BATCHES = "provider-batches"

# Since this patch a call refused by its provider budget after Temporal retried the activity
# (its worker was lost mid-call) counts the lost attempts: the next call is the attempt after
# them. Before it the next call repeated the lost attempt's number, so the crash was never
# recorded and the retry streamed over the lost attempt's output.
COUNT_LOST_ATTEMPTS = "count-lost-attempts"

# A workflow started since this patch takes every patch above without a marker of its own:
# one marker, not one per patch. Each marker is a history event and an upsert of
# TemporalChangeVersion for the server to write (`bench.shape`: our workflow's shape with
# four markers ran 38 jobs/s at 32 ms of the server's CPU a job, with one 44-47 jobs/s at
# 23-25 ms). Older workflows ask for each patch as they did. Patches added later are asked
# for after this one as usual.
PATCHES_2026_12 = "patches-2026-12"


def initial_search_attributes(job: PromptJobInput) -> TypedSearchAttributes:
    """What a job's workflow carries from its start, so the Web UI can find it."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(sa.JOB_STATE, JobState.QUEUED.value),
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
        self._parents_changed = False
        self._slot_freed = False
        self._fail_failed = False
        self._verdict: BatchVerdict | None = None
        self._patched_2026_12 = False

    @workflow.run
    async def run(self, job: PromptJobInput) -> PromptJobResult:
        # First: whether this workflow takes the patches below at once (PATCHES_2026_12).
        self._patched_2026_12 = workflow.patched(PATCHES_2026_12)
        settle_in_call = self._patched(SETTLE_SUCCESS_IN_CALL)
        self._fail_failed = self._patched(FAIL_FAILED_JOBS)
        self._attempt = job.attempts_before
        ceiling = timedelta(seconds=job.ceiling_s)
        if job.attempts_before >= job.max_attempts:
            # Restarted after its workflow was lost during the last attempt: that attempt is
            # spent, as a worker lost during it would have spent it (docs/decisions.md).
            message = f"attempt {job.attempts_before} was lost with its workflow; none left"
            return await self._fail(job, ErrorKind.WORKER_CRASH, message)
        try:
            if job.after and self._patched(WAIT_FOR_PARENTS):
                began = workflow.now()
                never = await self._wait_for_parents(job, began + ceiling)
                if never is not None:
                    return await self._fail(job, ErrorKind.STUCK, never)
                # The wait counted against the job's own ceiling.
                ceiling -= workflow.now() - began
            direct = Direct(job.attempts_before)
            if job.deferrable and self._patched(PROVIDER_BATCHES):
                began = workflow.now()
                batched = await self._wait_for_batch(job, began + ceiling)
                if isinstance(batched, str):
                    return await self._fail(job, ErrorKind.STUCK, batched)
                if isinstance(batched, PromptJobResult):
                    return batched
                direct = batched
                ceiling -= workflow.now() - began
            if self._patched(ORG_RUNNING_LIMIT):
                admitted = await self._call_when_admitted(job, settle_in_call, ceiling, direct)
                if isinstance(admitted, str):
                    return await self._fail(job, ErrorKind.STUCK, admitted)
                outcome = admitted
            else:
                outcome = await self._call_adapter(job, settle_in_call, ceiling)
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

    def _patched(self, patch: str) -> bool:
        """Whether the workflow takes `patch`'s branch: at once since PATCHES_2026_12 (no
        marker), else as `workflow.patched` says (a marker when it first runs the branch)."""
        return self._patched_2026_12 or workflow.patched(patch)

    @workflow.signal(name=PARENTS_CHANGED)
    def parents_changed(self) -> None:
        """A parent of this chain's child succeeded: check the parents again."""
        self._parents_changed = True

    async def _wait_for_parents(self, job: PromptJobInput, deadline: datetime) -> str | None:
        """Wait, durably, until every parent's current job has succeeded: None then, or the
        error message once the ceiling has passed first. The check on entry catches a parent
        that succeeded before this workflow started; a signal wakes every later check."""
        while True:
            self._parents_changed = False  # before the check: a signal during it is kept
            check = await self._check_parents(job)
            if not check.waiting_on:
                self._show(JobState.QUEUED)
                return None
            workflow.set_current_details(f"queued, waiting for parent prompt(s) {check.detail}")
            left = (deadline - workflow.now()).total_seconds()
            if left > 0:
                try:
                    await workflow.wait_condition(lambda: self._parents_changed, timeout=left)
                    continue
                except builtins.TimeoutError:
                    pass
            # The parents as they are now, for the message (a failure sends no signal).
            check = await self._check_parents(job)
            return (
                f"hard ceiling ({job.ceiling_s:g} s) passed while waiting for parent "
                f"prompt(s) {check.detail or 'that have just succeeded'} to succeed"
            )

    async def _check_parents(self, job: PromptJobInput) -> ParentsCheck:
        check: ParentsCheck = await workflow.execute_activity_method(
            JobActivities.check_parents,
            CheckParents(job.job_id),
            start_to_close_timeout=PROJECTION_TIMEOUT,
            retry_policy=PROJECTION_RETRY,
        )
        return check

    @workflow.signal(name=BATCH_DONE)
    def batch_done(self, verdict: BatchVerdict) -> None:
        """The job's provider batch is done with it: settled, or to run directly."""
        self._verdict = verdict

    async def _wait_for_batch(
        self, job: PromptJobInput, deadline: datetime
    ) -> PromptJobResult | Direct | str:
        """A deferrable job waits queued for its provider batch: its result once the batch
        settled it, how it runs directly (its provider has no batch API, or the batch sent it
        back), or the error message once the ceiling passed first."""
        deferral: Deferral = await workflow.execute_activity_method(
            DeferralActivities.defer_job,
            DeferJob(job.job_id),
            start_to_close_timeout=PROJECTION_TIMEOUT,
            retry_policy=PROJECTION_RETRY,
        )
        if not deferral.deferred:
            return Direct(job.attempts_before, via=deferral.reason)
        workflow.set_current_details("queued, deferred: waiting for its provider batch")
        left = (deadline - workflow.now()).total_seconds()
        try:
            await workflow.wait_condition(lambda: self._verdict is not None, timeout=max(left, 1))
        except builtins.TimeoutError:
            return f"hard ceiling ({job.ceiling_s:g} s) passed while waiting for a provider batch"
        verdict = self._verdict
        assert verdict is not None
        self._attempt = max(self._attempt, verdict.attempt)
        if not verdict.settled:
            if verdict.delay_s > 0:
                await workflow.sleep(timedelta(seconds=verdict.delay_s))
            return Direct(verdict.attempt, verdict.spared, verdict.via)
        if verdict.state is JobState.FAILED:
            kind = verdict.error_kind or ErrorKind.UNKNOWN
            self._show(verdict.state, kind)
            if self._fail_failed:
                raise job_failure(kind, verdict.error_message or "")
            return PromptJobResult(job.job_id, verdict.state, error_kind=kind)
        self._show(verdict.state)
        return PromptJobResult(job.job_id, verdict.state, verdict.response_id)

    @workflow.signal(name=SLOT_FREED)
    def slot_freed(self) -> None:
        """The job's org has a free running slot now: ask for it again."""
        self._slot_freed = True

    async def _call_when_admitted(
        self,
        job: PromptJobInput,
        settle_success: bool,
        ceiling: timedelta,
        direct: Direct | None = None,
    ) -> AdapterOutcome | str:
        """The adapter call, once the job holds one of its org's running slots (the first
        attempt takes it, in the transaction that starts it). While the org has none free the
        job waits queued, holding no worker slot: until a SLOT_FREED signal or SLOT_RECHECK,
        within the job's ceiling. The outcome, or the error message once the ceiling passed."""
        deadline = workflow.now() + ceiling
        budget = self._patched(PROVIDER_BUDGETS)
        # Attempts made so far, and of them those a 429 ended, which the job is not charged.
        direct = direct or Direct(job.attempts_before)
        made, spared = direct.made, direct.spared
        while True:
            self._slot_freed = False  # before the call: a signal during it is kept
            recheck = SLOT_RECHECK
            try:
                return await self._call_adapter(
                    job,
                    settle_success,
                    deadline - workflow.now(),
                    admission=True,
                    budget=budget,
                    made=made,
                    spared=spared,
                    via=direct.via,
                )
            except ActivityError as err:
                refused = err.cause
                if not isinstance(refused, ApplicationError):
                    raise
                if budget and refused.type == PROVIDER_BUSY:
                    attempt, wait_s = refused.details[0], refused.details[1]
                    lost = refused.details[2] if len(refused.details) > 2 else None
                    if isinstance(attempt, int):
                        made, spared = attempt, spared + 1
                    elif (
                        isinstance(lost, int) and lost > made and self._patched(COUNT_LOST_ATTEMPTS)
                    ):
                        made = lost
                    recheck = min(SLOT_RECHECK, timedelta(seconds=max(float(wait_s), 0.05)))
                elif refused.type != ORG_BUSY:
                    raise
            workflow.set_current_details(f"queued: {refused.message}")
            left = deadline - workflow.now()
            if left > timedelta(0):
                try:
                    await workflow.wait_condition(
                        lambda: self._slot_freed, timeout=min(left, recheck)
                    )
                except builtins.TimeoutError:
                    pass
                if workflow.now() < deadline:
                    continue
            return f"hard ceiling ({job.ceiling_s:g} s) passed while waiting: {refused.message}"

    @workflow.signal(name=ATTEMPT_REPORTED)
    def attempt_reported(self, report: AttemptReport) -> None:
        """An attempt started or was re-queued (the projection already has it)."""
        if report.attempt < self._attempt:
            return
        self._attempt = report.attempt
        self._show(report.state, report.error_kind)

    def _show(self, state: JobState, error_kind: ErrorKind | None = None) -> None:
        updates: list[SearchAttributeUpdate[Any]] = [
            sa.JOB_STATE.value_set(state.value),
            sa.ATTEMPT.value_set(self._attempt),
        ]
        if error_kind is not None:
            updates.append(sa.ERROR_KIND.value_set(error_kind.value))
        workflow.upsert_search_attributes(updates)
        details = f"{state.value}, attempt {self._attempt}"
        workflow.set_current_details(
            details + (f", last error {error_kind.value}" if error_kind else "")
        )

    async def _call_adapter(
        self,
        job: PromptJobInput,
        settle_success: bool,
        ceiling: timedelta,
        *,
        admission: bool = False,
        budget: bool = False,
        made: int | None = None,
        spared: int = 0,
        via: str = "",
    ) -> AdapterOutcome:
        """One activity of attempts: `made` attempts came before it (the job's count goes on
        from there), `spared` of them ended by a 429, which the job gets back."""
        deadline = workflow.now() + ceiling
        made = job.attempts_before if made is None else made
        max_attempts = job.max_attempts + spared
        return await workflow.execute_activity_method(
            JobActivities.call_adapter,
            AdapterCall(
                job.job_id,
                max_attempts,
                deadline.timestamp(),
                settle_success,
                attempt_offset=made,
                admission=admission,
                budget=budget,
                via=via,
            ),
            schedule_to_close_timeout=ceiling,
            start_to_close_timeout=timedelta(seconds=job.attempt_timeout_s),
            heartbeat_timeout=timedelta(seconds=job.heartbeat_timeout_s),
            # Delays come from the activity (next_retry_delay, by error kind); this interval
            # only applies to a lost worker, which is retried at once (the server's 1 s floor).
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                backoff_coefficient=1.0,
                maximum_attempts=max_attempts - made,
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
        settled = await self._settle(SettleJob(job.job_id, JobState.FAILED, kind, message))
        if settled.attempt is not None:
            self._attempt = max(self._attempt, settled.attempt)
        self._show(settled.state, settled.error_kind or kind)
        if self._fail_failed and settled.state is JobState.FAILED:
            # The row is settled; now the workflow tells the same story (whatever settled it).
            raise job_failure(settled.error_kind or kind, settled.error_message or message)
        return PromptJobResult(job.job_id, settled.state, error_kind=kind)

    def _closed(self, job: PromptJobInput, closed: ApplicationError) -> PromptJobResult:
        """The job was settled before this attempt could start (by a cancel, or `stuck` by
        the reconciler): nothing to run. A failed row fails the workflow, as `_fail` does."""
        state = closed_state(closed)
        if self._fail_failed and state is JobState.FAILED and len(closed.details) == 3:
            kind = kind_of_error_type(closed.details[1]) or ErrorKind.UNKNOWN
            self._show(state, kind)
            raise job_failure(kind, closed.details[2] or "")
        return PromptJobResult(job.job_id, state)

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


def job_failure(kind: ErrorKind, message: str) -> ApplicationError:
    """How a failed job ends its workflow: the type is the error kind, the message the row's
    error message. Not benign: Temporal's failure metrics are meant to count it."""
    return ApplicationError(message, type=kind.value, non_retryable=True)


def failure_of(err: ActivityError) -> tuple[ErrorKind, str]:
    """The error kind of an adapter call that Temporal gave up on (projections/domain/lifecycle.py
    says which timeout is which kind)."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and (kind := kind_of_error_type(cause.type)):
        return kind, cause.message
    if isinstance(cause, TimeoutError) and cause.type is not None:
        known = TIMEOUT_KINDS.get(cause.type.name.lower())
        if known is not None:
            return known
    return ErrorKind.UNKNOWN, str(cause or err)


def closed_state(err: ApplicationError) -> JobState:
    """The state of a job that was settled before its attempt could start (JOB_CLOSED's
    detail; histories from before it carried one say cancelled, the only way to get there)."""
    if err.details and isinstance(err.details[0], str):
        return JobState(err.details[0])
    return JobState.CANCELLED
