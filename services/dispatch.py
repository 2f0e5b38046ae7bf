"""The dispatcher: starts the workflow of every committed job and delivers cancel requests.

The submit commit is the acceptance; starting the workflow happens after it, in the same
process at once, and again from a periodic scan for as long as Temporal is unreachable. The
workflow id is the job id, so a second start of the same job is harmless. The reconciler
repairs rows whose workflow is gone or closed without settling them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import Priority, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.contracts import PARENTS_CHANGED
from projections.chain_store import ready_to_wake
from projections.lifecycle import ErrorKind, JobState
from projections.models import Job
from projections.projector import Transition
from projections.store import JobStore
from workflows.contracts import PromptJobInput
from workflows.prompt_job import PromptJobWorkflow, initial_search_attributes

log = logging.getLogger("promptjobs.dispatch")


# Temporal's matcher tells apart only `matching.priorityLevels` keys (default 5); the dev
# server and docker-compose's dynamic config raise it to this, one level per priority.
PRIORITY_LEVELS = 101


def temporal_priority(priority: int, org: str) -> Priority:
    """Our 0 (most urgent) … 100 onto Temporal's priority keys 1 … 101 (1 is first), one key
    per priority; the org is the fairness key, so one org's burst cannot starve another's."""
    return Priority(priority_key=1 + min(100, max(0, priority)), fairness_key=org)


class TemporalUnreachable(Exception):
    """Temporal did not take a start or cancel just now; the row keeps it, so the API's
    dispatcher delivers it once Temporal is back."""


class Dispatcher:
    def __init__(
        self,
        store: JobStore,
        client: Client,
        *,
        task_queue: str,
        ceiling_s: float,
        attempt_timeout_s: float,
        heartbeat_timeout_s: float,
        interval_s: float = 2.0,
        reconcile_interval_s: float = 30.0,
        reconcile_grace_s: float = 60.0,
    ) -> None:
        self.store = store
        self.client = client
        self.task_queue = task_queue
        self.ceiling_s = ceiling_s
        self.attempt_timeout_s = attempt_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.interval_s = interval_s
        self.reconcile_interval_s = reconcile_interval_s
        self.reconcile_grace_s = reconcile_grace_s
        self._background: set[asyncio.Task[None]] = set()
        self.temporal_reachable: bool | None = None

    # -- the request path hands work over without waiting --------------------------------

    def kick(self, job: Job) -> None:
        """Start `job`'s workflow in the background; the periodic scan is the safety net."""
        self._spawn(self._start_quietly(job))

    def kick_cancel(self, job: Job) -> None:
        self._spawn(self._cancel_quietly(job.job_id))

    # -- a caller that exits right away (the CLI) waits for the delivery instead -----------

    async def start_now(self, job: Job) -> None:
        await self._now(self.start(job))

    async def cancel_now(self, job_id: str) -> None:
        await self._now(self.deliver_cancel(job_id))

    async def _now(self, delivery: Awaitable[None]) -> None:
        try:
            await delivery
        except (RPCError, RuntimeError) as err:  # a lazy client's failed connect is a RuntimeError
            # The caller reports it; the scan (in the API's process) delivers it later.
            first_line = (str(err) or repr(err)).splitlines()[0]
            raise TemporalUnreachable(first_line[:160]) from err

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start_quietly(self, job: Job) -> None:
        try:
            await self.start(job)
        except Exception as err:  # the scan retries it; the job stays visibly queued
            self._unreachable(err)

    async def _cancel_quietly(self, job_id: str) -> None:
        try:
            await self.deliver_cancel(job_id)
        except Exception as err:
            self._unreachable(err)

    def _unreachable(self, err: Exception) -> None:
        if self.temporal_reachable is not False:
            log.warning("Temporal unreachable, will retry: %s", err)
        self.temporal_reachable = False

    # -- the Temporal side -------------------------------------------------------------

    def workflow_input(self, job: Job) -> PromptJobInput:
        return PromptJobInput(
            job_id=job.job_id,
            prompt_id=job.prompt_id,
            org=job.org,
            max_attempts=job.max_attempts,
            priority=job.priority,
            ceiling_s=self.ceiling_s,
            attempt_timeout_s=self.attempt_timeout_s,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            # Set from the prompt's parents when the job is created; only its workflow clears it.
            after=list(job.waiting_on or []),
        )

    async def start(self, job: Job) -> None:
        delay = None
        if job.scheduled_for is not None:
            wait = job.scheduled_for - datetime.now(UTC)
            delay = wait if wait > timedelta(0) else None
        workflow_input = self.workflow_input(job)
        try:
            await self.client.start_workflow(
                PromptJobWorkflow.run,
                workflow_input,
                id=job.job_id,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                start_delay=delay,
                priority=temporal_priority(job.priority, job.org),
                search_attributes=initial_search_attributes(workflow_input),
                static_summary=f"{job.org} · priority {job.priority} · prompt {job.prompt_id}",
            )
        except WorkflowAlreadyStartedError:
            pass
        self.temporal_reachable = True
        await self.store.mark_dispatched(job.job_id)

    async def deliver_cancel(self, job_id: str) -> None:
        try:
            await self.client.get_workflow_handle(job_id).cancel()
        except RPCError as err:
            if err.status is not RPCStatusCode.NOT_FOUND:
                raise
        self.temporal_reachable = True
        await self.store.cancel_delivered(job_id)

    # -- the periodic safety nets ------------------------------------------------------

    async def run(self, *, stop: asyncio.Event) -> None:
        """Scan until `stop`: start undispatched jobs, deliver cancels, reconcile drift."""
        last_reconcile = 0.0
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                await self.scan_once()
                if loop.time() - last_reconcile >= self.reconcile_interval_s:
                    await self.reconcile_once()
                    last_reconcile = loop.time()
            except Exception as err:
                self._unreachable(err)
            await _wait_any(stop, self.interval_s)

    async def scan_once(self) -> int:
        started = 0
        for job in await self.store.undispatched():
            await self.start(job)
            started += 1
        for job in await self.store.pending_cancels():
            await self.deliver_cancel(job.job_id)
        return started

    async def reconcile_once(self) -> int:
        """Repair jobs whose row says queued/running but whose workflow says otherwise."""
        before = datetime.now(UTC) - timedelta(seconds=self.reconcile_grace_s)
        repaired = 0
        for job in await self.store.unsettled_before(before):
            if await self.reconcile(job, self._describe):
                repaired += 1
        await self.wake_ready_children()
        return repaired

    async def wake_ready_children(self) -> int:
        """Signal the waiting chain children whose parents have all succeeded: the parent's
        attempt wakes them as it settles, but a worker killed right after its commit does not."""
        woken = 0
        for job_id in await ready_to_wake(self.store.sessions):
            try:
                await self.client.get_workflow_handle(job_id).signal(PARENTS_CHANGED)
                woken += 1
            except RPCError as err:
                if err.status is not RPCStatusCode.NOT_FOUND:
                    raise
        return woken

    async def _describe(self, job_id: str) -> WorkflowExecutionStatus | None:
        try:
            return (await self.client.get_workflow_handle(job_id).describe()).status
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                return None
            raise

    async def reconcile(
        self,
        job: Job,
        describe: Callable[[str], Awaitable[WorkflowExecutionStatus | None]],
    ) -> bool:
        status = await describe(job.job_id)
        if status is None:
            # The workflow is gone (lost dev server, retention): start it again.
            log.warning("job %s has no workflow; restarting it", job.job_id)
            await self.store.mark_undispatched(job.job_id)
            await self.start(job)
            return True
        if status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED):
            # A completed workflow settled its row before completing (it awaits the settling
            # activity); a row read as unsettled here was read just before that commit.
            return False
        # The workflow closed without its last projection landing (terminated by an operator,
        # timed out, or failed for a reason of its own). Settle the row to match.
        if status is WorkflowExecutionStatus.CANCELED or job.state is JobState.QUEUED:
            transition = Transition(job.job_id, JobState.CANCELLED)
        else:
            transition = Transition(
                job.job_id,
                JobState.FAILED,
                error_kind=ErrorKind.UNKNOWN,
                error_message=f"workflow closed as {status.name.lower()} without settling the job",
            )
        log.warning("job %s: workflow is %s; settling the row", job.job_id, status.name)
        return (await self.store.projector.apply(transition)).applied


async def _wait_any(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
