"""The dispatcher: starts the workflow of every committed job and delivers cancel requests.

The submit commit is the acceptance; starting the workflow happens after it, in the same
process at once, and again from a periodic scan for as long as Temporal is unreachable. The
workflow id is the job id, so a second start of the same job is harmless. Its loop also
runs the reconciler (services/reconcile.py) and the waking of waiting jobs
(services/wake.py). Scans page through every row; one job that cannot be handled is logged
and skipped, never stops a pass.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from projections.domain.lifecycle import ErrorKind, JobState
from projections.models import Job
from projections.projector import Transition
from projections.store import JobStore
from services.gone import unless_gone
from services.passes import (
    Passes,
    TemporalUnreachable,
    ThrottledLog,
    first_line,
    is_unreachable,
)
from services.priority import temporal_priority
from services.reconcile import Reconciler
from services.spend import SpendWatch
from services.wake import Waker
from services.webhooks import WebhookStarter
from workflows.contracts import PromptJobInput
from workflows.prompt_job import PromptJobWorkflow, initial_search_attributes

log = logging.getLogger("promptjobs.dispatch")


# Temporal's matcher tells apart only `matching.priorityLevels` keys (default 5); the dev
# server and docker-compose's dynamic config raise it to this, one level per priority.
PRIORITY_LEVELS = 101


# How many starts made since the scan began the dispatcher remembers (`_started_lately`); in
# a process whose scan does not run, past this a start may be made twice (harmless).
STARTED_LATELY_MAX = 10_000


def deferrable(job: Job) -> bool:
    """`options.deferrable`: the job may wait for a provider batch (issue 33)."""
    return bool((job.options or {}).get("deferrable"))


class Dispatcher:
    def __init__(
        self,
        store: JobStore,
        client: Client,
        *,
        task_queue: str,
        ceiling_s: float,
        attempt_timeout_s: float,
        deferrable_ceiling_s: float | None = None,
        heartbeat_timeout_s: float,
        interval_s: float = 2.0,
        reconcile_interval_s: float = 30.0,
        reconcile_grace_s: float = 60.0,
        page_size: int = 200,
        org_max_running: int = 0,
        worker_heartbeat_s: float = 15.0,
        max_starts: int = 64,
        # A webhook's first retry, its longest wait between tries, and its read timeout.
        webhook_retries: tuple[float, float, float] = (5.0, 6 * 3600.0, 10.0),
    ) -> None:
        self.store = store
        self.client = client
        self.task_queue = task_queue
        self.ceiling_s = ceiling_s
        self.deferrable_ceiling_s = deferrable_ceiling_s or ceiling_s
        self.attempt_timeout_s = attempt_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.interval_s = interval_s
        self.reconcile_interval_s = reconcile_interval_s
        self.page_size = page_size
        self._background: set[asyncio.Task[None]] = set()
        # Kicked jobs whose start is queued or on its way, most urgent first and, among
        # equals, taking turns by org (a rank per org, fair queuing's virtual time: one
        # org's burst does not hold another's jobs behind it); at most `max_starts` starts
        # in flight (`_start_queued`).
        self.max_starts = max_starts
        self._to_start: list[tuple[int, int, int, Job]] = []
        self._org_rank: dict[str, int] = {}
        self._rank_started = 0
        self._starting: set[str] = set()
        # Started since the scan began: its page may have read them before their record.
        self._started_lately: set[str] = set()
        self._starters = 0
        self._order = itertools.count()
        self.passes = Passes(page_size, ThrottledLog(log))
        # Its other jobs, each in a module of its own, handed what they need; its loop runs
        # them.
        self.waker = Waker(
            store,
            client,
            org_max_running,
            task_queue=task_queue,
            worker_heartbeat_s=worker_heartbeat_s,
        )
        self.spend_watch = SpendWatch(store.spend_caps)
        self.webhooks = WebhookStarter(
            store,
            client,
            task_queue,
            first_retry_s=webhook_retries[0],
            longest_wait_s=webhook_retries[1],
            timeout_s=webhook_retries[2],
        )
        self.reconciler = Reconciler(
            store,
            client,
            self.passes,
            start=self.start,
            ceiling_of=self.ceiling_of,
            wake_ready_children=self.waker.wake_ready_children,
            grace_s=reconcile_grace_s,
        )

    # -- the request path hands work over without waiting --------------------------------

    def kick(self, job: Job) -> None:
        """Start `job`'s workflow in the background; the periodic scan is the safety net.

        A burst of submits outruns Temporal's starts: the jobs wait here in a queue, most
        urgent first, for one of `max_starts` starters, rather than each holding a start
        request of its own open (a thousand in flight at c=32 on two cores, whose objects
        made the API's full collections pause every request ~60 ms: bench/README.md).
        Temporal's own fairness keys order the started workflows' tasks; this orders the
        starts the same way."""
        if job.job_id in self._starting:
            return
        self._starting.add(job.job_id)
        rank = max(self._org_rank.get(job.org, 0), self._rank_started) + 1
        self._org_rank[job.org] = rank
        heapq.heappush(self._to_start, (job.priority, rank, next(self._order), job))
        if self._starters < self.max_starts:
            self._starters += 1
            self._spawn(self._start_queued())

    def kick_cancel(self, job: Job) -> None:
        self._spawn(self._quietly("cancel", job.job_id, self.deliver_cancel(job.job_id)))

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
            raise TemporalUnreachable(first_line(err)[:160]) from err

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start_queued(self) -> None:
        """Start queued jobs until none is left."""
        try:
            while self._to_start:
                _, self._rank_started, _, job = heapq.heappop(self._to_start)
                if not self._to_start:
                    self._org_rank.clear()  # nothing waits: every org starts afresh
                try:
                    await self.start(job)
                except Exception as err:  # the scan retries it; the row keeps the request
                    self.passes.failed("start", job.job_id, err)
                else:
                    if len(self._started_lately) < STARTED_LATELY_MAX:
                        self._started_lately.add(job.job_id)
                finally:
                    self._starting.discard(job.job_id)
        finally:
            self._starters -= 1

    async def _quietly(self, action: str, job_id: str, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as err:  # the scan retries it; the row keeps the request
            self.passes.failed(action, job_id, err)

    # -- the Temporal side -------------------------------------------------------------

    def ceiling_of(self, job: Job) -> float:
        """The job's hard ceiling: a deferrable job's is longer (its provider batch may take
        the provider's 24 hours)."""
        return self.deferrable_ceiling_s if deferrable(job) else self.ceiling_s

    def workflow_input(self, job: Job) -> PromptJobInput:
        return PromptJobInput(
            job_id=job.job_id,
            prompt_id=job.prompt_id,
            org=job.org,
            max_attempts=job.max_attempts,
            priority=job.priority,
            ceiling_s=self.ceiling_of(job),
            deferrable=deferrable(job),
            attempt_timeout_s=self.attempt_timeout_s,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            # Set from the prompt's parents when the job is created; only its workflow clears it.
            after=list(job.waiting_on or []),
            # A restarted workflow (the reconciler's) continues the row's count.
            attempts_before=job.attempt,
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
        except RPCError as err:
            if err.status is not RPCStatusCode.INVALID_ARGUMENT:
                raise
            await self._end_refused(job, err)
            return
        if await self.store.mark_dispatched(job.job_id):
            # The API cancelled the row while this start was on its way: the workflow exists
            # now, and must be cancelled too (its attempt finds the job closed meanwhile).
            await self.deliver_cancel(job.job_id)

    async def _end_refused(self, job: Job, err: RPCError) -> None:
        """Temporal refused the start as invalid: asking again gets the same answer, so the
        job ends at once, `stuck` (it can never run), saying why, rather than waiting queued
        for ever. The error kind is the one a queued job may fail with (docs/decisions.md)."""
        message = f"Temporal refused to start the job: {first_line(err)}"
        ended = await self.store.projector.apply(
            Transition(
                job.job_id, JobState.FAILED, error_kind=ErrorKind.STUCK, error_message=message
            )
        )
        if ended.applied:
            log.error("job %s: %s", job.job_id, message)

    async def deliver_cancel(self, job_id: str) -> None:
        await unless_gone(self.client.get_workflow_handle(job_id).cancel())
        await self.store.cancel_delivered(job_id)

    # -- the periodic safety nets ------------------------------------------------------

    async def run(self, *, stop: asyncio.Event) -> None:
        """Scan until `stop`: start undispatched jobs, deliver cancels, reconcile drift.
        A failed scan does not skip the reconcile pass, nor the other way round."""
        last_reconcile: float | None = None
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            await self._pass("scan", self.scan_once)
            await self._pass("wake", self.waker.wake_slot_waiters)
            await self._pass("wake budgets", self.waker.wake_budget_waiters)
            await self._pass("wake spend caps", self.waker.wake_spend_waiters)
            await self._pass("watch spend caps", self.spend_watch.watch_once)
            await self._pass("start webhooks", self.webhooks.start_pending)
            if last_reconcile is None or loop.time() - last_reconcile >= self.reconcile_interval_s:
                last_reconcile = loop.time()
                await self._pass("reconcile", self.reconciler.reconcile_once)
            await _wait_any(stop, self.interval_s)

    async def _pass(self, name: str, scan: Callable[[], Awaitable[int]]) -> None:
        try:
            await scan()
        except Exception as err:
            if is_unreachable(err):
                self.passes.unreachable(err)
            else:
                self.passes.failures.warning(name, "%s pass failed, will retry: %r", name, err)

    async def scan_once(self) -> int:
        started = 0
        self._started_lately.clear()
        undispatched = self.passes.each(
            lambda after: self.store.undispatched(self.page_size, after)
        )
        async for job in undispatched:
            if job.job_id in self._starting or job.job_id in self._started_lately:
                continue  # kicked: its start is queued, on its way, or just recorded
            if await self.passes.isolated("start", job, self._started(job)):
                started += 1
        cancels = self.passes.each(lambda after: self.store.pending_cancels(self.page_size, after))
        async for job in cancels:
            await self.passes.isolated("cancel", job, self.deliver_cancel(job.job_id))
        return started

    async def _started(self, job: Job) -> bool:
        await self.start(job)
        return True


async def _wait_any(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
