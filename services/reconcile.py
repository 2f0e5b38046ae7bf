"""The reconciler: repairs rows whose workflow says otherwise (gone: started again; closed
without settling its row: settled as it ended), and ends jobs that passed their hard ceiling
with no worker to end them. It pages through every unsettled row; one job that cannot be
handled is logged and skipped, never stops a pass."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from projections.domain.lifecycle import ErrorKind, JobState
from projections.models import Job
from projections.projector import Transition
from projections.store import JobStore
from services.gone import GONE, unless_gone
from services.passes import Passes
from workflows.contracts import PromptJobResult
from workflows.results import job_result

log = logging.getLogger("promptjobs.dispatch")

Describe = Callable[[str], Awaitable[WorkflowExecutionStatus | None]]


class Reconciler:
    """Handed by the dispatcher what it needs: how to start a job's workflow again (`start`),
    a job's hard ceiling (`ceiling_of`), the waking of chain children, and its passes."""

    def __init__(
        self,
        store: JobStore,
        client: Client,
        passes: Passes,
        *,
        start: Callable[[Job], Awaitable[None]],
        ceiling_of: Callable[[Job], float],
        wake_ready_children: Callable[[], Awaitable[int]],
        grace_s: float = 60.0,
    ) -> None:
        self.store = store
        self.client = client
        self.passes = passes
        self.start = start
        self.ceiling_of = ceiling_of
        self.wake_ready_children = wake_ready_children
        self.grace_s = grace_s

    async def reconcile_once(self) -> int:
        """Repair jobs whose row says queued/running but whose workflow says otherwise."""
        before = datetime.now(UTC) - timedelta(seconds=self.grace_s)
        repaired = 0
        size = self.passes.page_size
        unsettled = self.passes.each(lambda after: self.store.unsettled_before(before, size, after))
        async for job in unsettled:
            if await self.passes.isolated("reconcile", job, self.reconcile(job, self.describe)):
                repaired += 1
        await self.wake_ready_children()
        return repaired

    async def describe(self, job_id: str) -> WorkflowExecutionStatus | None:
        """The job's workflow's status; None if it is gone."""
        described = await unless_gone(self.client.get_workflow_handle(job_id).describe())
        return None if described is GONE else described.status

    async def reconcile(self, job: Job, describe: Describe) -> bool:
        if self._past_ceiling(job):
            return await self._end_stuck(job)
        status = await describe(job.job_id)
        if status is None:
            # The workflow is gone (lost dev server, retention): start it again. The row stays
            # marked dispatched, so if this start fails the next pass tries again.
            log.warning("job %s has no workflow; restarting it", job.job_id)
            await self.start(job)
            return True
        if status is WorkflowExecutionStatus.RUNNING:
            return False
        # A workflow settles its row before it closes; a row still unsettled was either read
        # just before that commit (the projector then ignores what follows: terminal rows are
        # absorbing) or its workflow closed without its last projection landing.
        transition = await self._settlement(job, status)
        applied = (await self.store.projector.apply(transition)).applied
        if applied:
            log.warning("job %s: workflow is %s; settled the row", job.job_id, status.name)
        return applied

    async def _settlement(self, job: Job, status: WorkflowExecutionStatus) -> Transition:
        """The row's settlement from its closed workflow: what a workflow of ours reported
        (a result, or a Failed workflow with the job's error), else what befell it."""
        if status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.FAILED):
            reported = await self._reported(job.job_id)
            if reported is not None and reported.state == JobState.CANCELLED:
                return Transition(job.job_id, JobState.CANCELLED)
            if reported is not None and reported.state == JobState.FAILED:
                return Transition(
                    job.job_id,
                    JobState.FAILED,
                    error_kind=reported.error_kind or ErrorKind.UNKNOWN,
                    error_message=reported.error_message
                    or f"the workflow ended the job failed ({reported.error_kind})",
                )
            if reported is not None:
                return self._lost(job, f"workflow completed (job {reported.state})")
        if status is WorkflowExecutionStatus.CANCELED or job.state is JobState.QUEUED:
            return Transition(job.job_id, JobState.CANCELLED)
        return self._lost(job, f"workflow closed as {status.name.lower()}")

    @staticmethod
    def _lost(job: Job, what: str) -> Transition:
        return Transition(
            job.job_id,
            JobState.FAILED,
            error_kind=ErrorKind.UNKNOWN,
            error_message=f"{what} without settling the job",
        )

    async def _reported(self, job_id: str) -> PromptJobResult | None:
        """What the closed workflow says of its job; None if it failed for a reason not ours."""
        try:
            return await job_result(self.client.get_workflow_handle(job_id))
        except WorkflowFailureError:
            return None

    def _past_ceiling(self, job: Job) -> bool:
        """The job could have run for longer than its hard ceiling (plus the grace) and has
        not settled: no worker is there to end it (none at all, or none keeping up)."""
        # From when Temporal had it (a start delayed by an outage does not age the job) or
        # its scheduled time, whichever is later.
        start = max(job.dispatched_at or job.created_at, job.scheduled_for or job.created_at)
        limit = timedelta(seconds=self.ceiling_of(job) + self.grace_s)
        return datetime.now(UTC) > start + limit

    async def _end_stuck(self, job: Job) -> bool:
        """Settle the row `stuck`, then terminate its workflow, which no worker runs: left
        open, it would show Running in the Web UI while the job has ended."""
        message = (
            f"the job passed its hard ceiling ({self.ceiling_of(job):g} s) while "
            f"{job.state.value} "
            "with no worker to end it"
        )
        settled = await self.store.projector.apply(
            Transition(
                job.job_id, JobState.FAILED, error_kind=ErrorKind.STUCK, error_message=message
            )
        )
        if settled.state is not JobState.FAILED:
            return settled.applied
        handle = self.client.get_workflow_handle(job.job_id)
        await unless_gone(handle.terminate(f"{ErrorKind.STUCK.value}: {settled.error_message}"))
        log.warning("job %s: %s", job.job_id, message)
        return settled.applied
