"""The job's activities: `call_adapter` (one `Attempt`, activities/attempt.py, heartbeating),
settling a success, a chain child's check of its parents, and settling a job's end."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError

from activities.adapters.base import AdapterRegistry
from activities.attempt import (
    Attempt,
    AttemptTools,
    DelayedReport,
    heartbeating,
    job_closed,
    provider_busy,
)
from activities.budgets import WorkerBudgets
from activities.circuits import WorkerCircuits
from activities.contracts import (
    ORG_BUSY,
    PARENTS_CHANGED,
    AdapterCall,
    AdapterOutcome,
    AttemptReport,
    CheckParents,
    FinalizeSuccess,
    ParentsCheck,
    SettleJob,
    SettleResult,
)
from activities.outages import through_outages
from activities.output import OutputStreams
from activities.prices import PriceTable
from activities.stale import AtMostEvery
from projections.budgets import Draw
from projections.chain_store import ChainStore
from projections.domain.lifecycle import BackoffPolicy, JobState
from projections.errors import database_unavailable
from projections.ids import response_id_for
from projections.models import Job, Prompt
from projections.projector import Transition
from projections.store import JobStore
from projections.streams import AttemptUsage, OutputBatch

# How stale the live fleet's size and the active orgs an admission uses may be.
FLEET_READ_S = 2.0


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class JobActivities:
    def __init__(
        self,
        store: JobStore,
        adapters: AdapterRegistry,
        backoff: BackoffPolicy,
        worker: str | None = None,
        report_running_after_s: float = 5.0,
        org_max_running: int = 0,
        streams: OutputStreams | None = None,
        prices: PriceTable | None = None,
        metrics_org_labels: bool = False,
        priority_aging_s: float = 5.0,
        max_provider_budgets: int = 1000,
        task_queue: str | None = None,
        worker_heartbeat_s: float = 15.0,
        own_slots: int = 0,
        circuit_failures: int = 5,
        circuit_cooldown_s: float = 30.0,
        fallback_after_s: float = 30.0,
        heartbeat_s: float = 10.0,
        caps_allow_unpriced: bool = False,
    ) -> None:
        self.store = store
        self.projector = store.projector
        self.worker = worker or worker_identity()
        prices = prices or PriceTable.load(None)
        self.tools = AttemptTools(
            store=store,
            adapters=adapters,
            backoff=backoff,
            streams=streams
            or OutputStreams(store.projector.append_outputs, store.attempts_standing),
            prices=prices,
            worker=self.worker,
            budgets=WorkerBudgets(
                store.budgets,
                adapters,
                aging_s=priority_aging_s,
                most=max_provider_budgets,
                spend=store.spend_caps,
                prices=prices,
                allow_unpriced=caps_allow_unpriced,
            ),
            metrics_org_labels=metrics_org_labels,
            circuits=WorkerCircuits(
                store.circuits,
                adapters,
                threshold=circuit_failures,
                cooldown_s=circuit_cooldown_s,
                fallback_after_s=fallback_after_s,
                # A probe outlives its worker by no more than the heartbeat would.
                probe_s=3 * heartbeat_s,
            ),
        )
        # An attempt tells its workflow it is running (for the Web UI) only once it has run
        # this long: each report is a workflow task, and a quick call would pay one for a
        # state the operator never sees. The projection records `running` at once.
        self.report_running_after_s = report_running_after_s
        # Each org's running limit where org_limits has no row of its own (0: no limit),
        # within its fair part of the live fleet of `task_queue` (None: no fleet share).
        self.org_max_running = org_max_running
        self.task_queue = task_queue
        self.worker_heartbeat_s = worker_heartbeat_s
        # This worker's own activity slots: the fleet it knows of before its first
        # registration is read back (its first attempts must not run on the configured limit).
        self.own_slots = own_slots
        self._org_limit_now = org_max_running
        self._fleet_read = AtMostEvery(FLEET_READ_S, self._read_fleet)

    @activity.defn(name="call_adapter")
    async def call_adapter(self, call: AdapterCall) -> AdapterOutcome:
        """One attempt. Temporal runs the attempts; each reports its start and its failure to
        the projector so clients see running → queued → running with the error and the time
        of the next attempt. A success the attempt settles itself (`call.settle_success`, set
        by workflows since the patch settle-success-in-call); failures the workflow settles."""
        timeout = activity.info().heartbeat_timeout or timedelta(seconds=10)
        # Heartbeat through the whole attempt, its projection writes included: under load a
        # write may wait on the event-log lock for longer than the heartbeat timeout, and a
        # silent attempt would be taken for a dead worker.
        async with heartbeating(max(0.2, timeout.total_seconds() / 4)):
            return await self._attempt(call, call.attempt_offset + activity.info().attempt)

    async def _attempt(self, call: AdapterCall, attempt: int) -> AdapterOutcome:
        org_limit = await self._org_limit() if call.admission else None
        draw_of = await self._draw_of(call)
        await self.tools.circuits.refresh()
        started = await through_outages(
            "start attempt",
            lambda: self.projector.start_attempt(
                call.job_id,
                attempt,
                self.worker,
                org_limit=org_limit,
                draw_of=draw_of,
                places=self.tools.circuits,
            ),
        )
        if started.budget_wait is not None:
            wait = started.budget_wait
            seconds = (wait.until - datetime.now(UTC)).total_seconds()
            # Nothing was called: the job stays queued and its workflow waits for room, then
            # asks again as this attempt (the ones before it, lost with their worker, count).
            raise provider_busy(wait.describe(), None, max(seconds, 0.05), made=attempt - 1)
        if started.waiting is not None:
            waiting = started.waiting
            # Nothing changed: the job stays queued and its workflow waits for a slot.
            raise ApplicationError(
                waiting.describe(),
                waiting.running,
                waiting.limit,
                type=ORG_BUSY,
                non_retryable=True,
                # Expected, not a fault: the SDK logs it quietly, metrics do not count it.
                category=ApplicationErrorCategory.BENIGN,
            )
        if started.state is JobState.SUCCEEDED and call.settle_success:
            # An earlier attempt settled the job, but Temporal never heard it complete (its
            # worker died after the commit): hand back that settlement, change nothing.
            return await self._settlement(call.job_id, started.attempt)
        if started.state.is_terminal:
            raise job_closed(started.state, started.error_kind, started.error_message)
        if started.job is not None and started.prompt is not None:
            job, prompt = started.job, started.prompt
        else:
            # Not started by this call (a repeat of a start whose commit landed): read them.
            job, prompt = await self.tools.load(call.job_id)
        async with DelayedReport(
            AttemptReport(JobState.RUNNING, attempt), self.report_running_after_s
        ) as running:
            draw = started.draw if started.drew else None
            probing = started.probing
            done = await Attempt(
                self.tools,
                call,
                attempt,
                job,
                prompt,
                running,
                draw,
                probing=probing,
                moved=started.moved,
            ).run()
        if not call.settle_success:
            await self.tools.settling.usage(done.usage, done.tail)
            return done.outcome
        settled = await self._settle_success(call.job_id, done.outcome, done.tail, done.usage)
        # The response text is in the projection now; it need not enter workflow history.
        return replace(done.outcome, text="", settled=settled)

    async def _org_limit(self) -> int:
        """The default running limit of an org: the configured one, within its fair part of
        the live fleet (projections/admission.fleet_share), read at most every FLEET_READ_S."""
        if self.task_queue is None:
            return self.org_max_running
        await self._fleet_read()
        return self._org_limit_now

    async def _read_fleet(self) -> None:
        assert self.task_queue is not None
        since = datetime.now(UTC) - timedelta(seconds=3 * self.worker_heartbeat_s)
        try:
            self._org_limit_now = await self.store.default_org_limit(
                self.org_max_running, self.task_queue, since, own_slots=self.own_slots
            )
        except Exception as err:
            # The last read stands: the attempt's start waits the outage out anyway.
            if not database_unavailable(err):
                raise

    async def _draw_of(self, call: AdapterCall) -> Callable[[Job, Prompt], Draw | None] | None:
        """How the attempt's start decides its draw on a provider budget, where any may
        bind (otherwise the start reads nothing more than before)."""
        if not call.budget:
            return None
        await self.tools.budgets.refresh()
        return self.tools.budgets.draw_of if self.tools.budgets.may_bind() else None

    async def _settlement(self, job_id: str, attempt: int) -> AdapterOutcome:
        job, _prompt = await self.tools.load(job_id)
        # The attempt that committed may have died before it woke the chain's children.
        await wake_children(self.store.chains, job.prompt_id)
        settled = SettleResult(False, job.state, job.response_id)
        return AdapterOutcome(text="", provider="", model="", attempt=attempt, settled=settled)

    @activity.defn(name="finalize_success")
    async def finalize_success(self, final: FinalizeSuccess) -> SettleResult:
        """Persist the response and mark the job succeeded, if the attempt is still current.
        (Workflows started before the patch `settle-success-in-call` only.)"""
        return await self._settle_success(final.job_id, final.outcome)

    async def _settle_success(
        self,
        job_id: str,
        outcome: AdapterOutcome,
        tail: OutputBatch | None = None,
        usage: AttemptUsage | None = None,
    ) -> SettleResult:
        response_id = response_id_for(job_id)
        result = await self.tools.settling.succeed(
            job_id, outcome.attempt, outcome, tail=tail, usage=usage
        )
        kept = result.state is JobState.SUCCEEDED
        if kept:
            await wake(result.waiting_children)
        return SettleResult(result.applied, result.state, response_id if kept else None)

    @activity.defn(name="check_parents")
    async def check_parents(self, check: CheckParents) -> ParentsCheck:
        """A chain's child: which parents have not succeeded yet (recorded on its row)."""
        state = await self.store.chains.check_parents(check.job_id)
        return ParentsCheck(state.waiting_on, state.detail)

    @activity.defn(name="settle_job")
    async def settle_job(self, settle: SettleJob) -> SettleResult:
        result = await self.projector.apply(
            Transition(
                settle.job_id,
                settle.state,
                error_kind=settle.error_kind,
                error_message=settle.error_message,
            )
        )
        return SettleResult(
            result.applied,
            result.state,
            attempt=result.attempt,
            error_kind=result.error_kind,
            error_message=result.error_message,
        )


async def wake_children(chains: ChainStore, prompt_id: str) -> None:
    """Tell the waiting jobs of a succeeded prompt's children to check their parents again."""
    await wake(await chains.waiting_children(prompt_id))


async def wake(job_ids: list[str]) -> None:
    """Tell these waiting jobs to check their parents again. A signal that cannot be sent
    now is sent by the dispatcher's safety net (ready_to_wake)."""
    for job_id in job_ids:
        try:
            await activity.client().get_workflow_handle(job_id).signal(PARENTS_CHANGED)
        except RPCError as err:
            activity.logger.warning("could not wake chained job %s: %s", job_id, err)
