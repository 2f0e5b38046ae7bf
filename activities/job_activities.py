"""The job's activities: the adapter call (heartbeating, reporting each attempt) and settling."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from opentelemetry import trace
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError

from activities.adapters.base import (
    AdapterRegistry,
    AdapterRequest,
    InvalidOptions,
    StreamedOutput,
)
from activities.contracts import (
    ATTEMPT_REPORTED,
    JOB_CLOSED,
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
from activities.errors import AdapterError
from activities.outages import through_outages
from activities.output import OutputStreams
from activities.prices import PriceTable
from projections import metrics
from projections.chain_store import check_parents, parent_answers, waiting_children
from projections.chains import substitute
from projections.ids import response_id_for
from projections.lifecycle import (
    AttemptResult,
    BackoffPolicy,
    End,
    ErrorKind,
    FailedAttempt,
    JobState,
    next_step,
)
from projections.models import Job, Prompt, job_options
from projections.projector import Projector, Transition
from projections.streams import AttemptUsage, OutputBatch

TRACER = trace.get_tracer("promptjobs.activities")

T = TypeVar("T")


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@asynccontextmanager
async def heartbeating(interval_s: float) -> AsyncIterator[None]:
    """Heartbeat while the body runs: a dead worker stops heartbeating, and Temporal then
    retries the attempt elsewhere. Heartbeats also carry cancellation into the activity.

    The first beat comes after one interval, not at once: Temporal counts the heartbeat
    timeout from the attempt's start until the first beat, so waiting a quarter of it is as
    safe, and a quick call (most of them) costs the server no heartbeat write at all."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(interval_s)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()


def cut_off_by_shutdown() -> bool:
    """The running activity was cancelled because its worker is shutting down, not by request."""
    details = activity.cancellation_details()
    return details is not None and details.worker_shutdown and not details.cancel_requested


@dataclass(frozen=True)
class Succeeded:
    """A successful call: what it produced, the streamed text not written yet, and the
    attempt's usage record."""

    outcome: AdapterOutcome
    tail: OutputBatch | None
    usage: AttemptUsage


# About four characters a token: OpenAI's rule of thumb for English, used only where the
# provider did not say (a stream cut before its usage chunk, the fake provider).
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


class AttemptMeter:
    """Times one attempt and makes its usage record: the provider's counts where it gave
    them, estimates where it did not (flagged), and the cost by the worker's price table."""

    def __init__(
        self, owner: JobActivities, org: str, request: AdapterRequest, output: StreamedOutput
    ) -> None:
        self.owner = owner
        self.org = org
        self.request = request
        self.output = output
        self.began = time.monotonic()
        self.began_at = datetime.now(UTC)

    def usage(self, outcome: str, result: AttemptResult | None = None) -> AttemptUsage:
        output = self.output
        adapters = self.owner.adapters
        options = self.request.options
        provider = result.provider if result else adapters.provider_of(options)
        model = result.model if result else adapters.model_of(options)
        given_in = result.input_tokens if result else output.input_tokens
        given_out = result.output_tokens if result else output.output_tokens
        estimated = output.usage_estimated or bool(result and result.usage_estimated)
        if given_in is None:
            system = str(options.get("system") or "")
            given_in, estimated = estimate_tokens(system + self.request.prompt), True
        if given_out is None:
            given_out, estimated = estimate_tokens(output.text), True
        first = output.first_delta_at
        origin = output.called_at or self.began
        return AttemptUsage(
            job_id=self.request.job_id,
            attempt=self.request.attempt,
            org=self.org,
            outcome=outcome,
            provider=provider[:32],
            model=model[:128],
            input_tokens=given_in,
            output_tokens=given_out,
            usage_estimated=estimated,
            cost_usd=self.owner.prices.cost(model, given_in, given_out),
            output_chars=output.length,
            first_token_ms=None if first is None else round((first - origin) * 1000),
            duration_ms=round((time.monotonic() - self.began) * 1000),
            started_at=self.began_at,
            ended_at=datetime.now(UTC),
        )


class JobActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        projector: Projector,
        adapters: AdapterRegistry,
        backoff: BackoffPolicy,
        worker: str | None = None,
        report_running_after_s: float = 5.0,
        org_max_running: int = 0,
        streams: OutputStreams | None = None,
        prices: PriceTable | None = None,
        metrics_org_labels: bool = False,
    ) -> None:
        self.sessions = sessions
        self.projector = projector
        self.adapters = adapters
        self.backoff = backoff
        self.streams = streams or OutputStreams(projector.append_outputs, sessions)
        self.prices = prices or PriceTable.load(None)
        self.metrics_org_labels = metrics_org_labels
        self.worker = worker or worker_identity()
        # An attempt tells its workflow it is running (for the Web UI) only once it has run
        # this long: each report is a workflow task, and a quick call would pay one for a
        # state the operator never sees. The projection records `running` at once.
        self.report_running_after_s = report_running_after_s
        # Each org's running limit where org_limits has no row of its own (0: no limit).
        self.org_max_running = org_max_running

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
        org_limit = self.org_max_running if call.admission else None
        started = await through_outages(
            "start attempt",
            lambda: self.projector.start_attempt(
                call.job_id, attempt, self.worker, org_limit=org_limit
            ),
        )
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
            job, prompt = await self._load(call.job_id)
        async with DelayedReport(
            AttemptReport(JobState.RUNNING, attempt), self.report_running_after_s
        ) as running:
            done = await self._run(call, attempt, running, job, prompt)
        if not call.settle_success:
            await self._end_attempt(done.tail, done.usage)
            return done.outcome
        settled = await self._settle_success(call.job_id, done.outcome, done.tail, done.usage)
        # The response text is in the projection now; it need not enter workflow history.
        return replace(done.outcome, text="", settled=settled)

    async def _run(
        self, call: AdapterCall, attempt: int, running: DelayedReport, job: Job, prompt: Prompt
    ) -> Succeeded:
        """The adapter call, streaming its text to the projection as it comes. It ends in a
        success (returned with the text not yet written and the attempt's usage), a failure
        (recorded, and raised for Temporal), a cancellation, or a stop: the job's row says
        the call is no longer wanted (cancelled, or taken over by a later attempt), and the
        provider's stream is closed at once instead of at Temporal's next heartbeat."""
        # On the attempt's activity span (a no-op span while tracing is off).
        trace.get_current_span().set_attributes(
            {
                "promptjobs.job_id": job.job_id,
                "promptjobs.org": job.org,
                "promptjobs.attempt": attempt,
            }
        )
        text = prompt.text
        if prompt.after:
            # A chain's child runs with its parents' answers in place of the placeholders.
            answers = await parent_answers(self.sessions, prompt.after)
            text = substitute(text, prompt.after, answers)
        request = AdapterRequest(
            job_id=job.job_id,
            prompt_id=prompt.prompt_id,
            prompt=text,
            attempt=attempt,
            options=job_options(job, prompt),
        )
        calling: list[asyncio.Task[AttemptResult]] = []

        def stop(why: str) -> None:
            calling[0].cancel(why)

        stream = self.streams.open(job.job_id, attempt, stop)
        meter = AttemptMeter(self, job.org, request, stream.output)
        calling.append(asyncio.create_task(self._complete(request, stream.output)))
        try:
            try:
                result = await calling[0]
            finally:
                # No more flushes of it; what it has not written goes with the attempt's end.
                await self.streams.close(stream)
        except AdapterError as err:
            usage = meter.usage(err.kind.value)
            raise await self._failed_attempt(
                call, attempt, err, running, stream.unwritten(), usage
            ) from err
        except asyncio.CancelledError:
            own = asyncio.current_task()
            if stream.stopped is not None and own is not None and not own.cancelling():
                # Stopped by the job's row, not by Temporal: nobody waits for this call.
                await self._end_attempt(stream.unwritten(), meter.usage(JobState.CANCELLED.value))
                raise await self._stopped(call.job_id, attempt, stream.stopped) from None
            if not cut_off_by_shutdown():
                # The workflow asked: the job is being cancelled. What the call streamed and
                # consumed is kept, however often the cancel is repeated meanwhile.
                usage = meter.usage(JobState.CANCELLED.value)
                await asyncio.shield(self._end_attempt(stream.unwritten(), usage))
                raise
            # The worker's grace period ran out mid-call. Reported as a cancellation this
            # would be refused (nobody asked) and the attempt would idle until its heartbeat
            # timed out; as a worker_crash it is re-queued now and runs on another worker.
            lost = AdapterError(
                ErrorKind.WORKER_CRASH,
                f"attempt {attempt} cut off: worker {self.worker} shut down mid-call",
            )
            usage = meter.usage(lost.kind.value)
            raise await self._failed_attempt(
                call, attempt, lost, running, stream.unwritten(), usage
            ) from None
        if result.text != stream.output.text:
            if stream.output.length:
                activity.logger.warning(
                    "job %s: the %s adapter's text differs from what it streamed; the streamed "
                    "text stands",
                    call.job_id,
                    result.provider,
                )
            else:
                stream.output.delta(result.text)  # an adapter that answered in one piece
        usage = meter.usage(JobState.SUCCEEDED.value, result)
        outcome = AdapterOutcome(
            **asdict(
                replace(
                    result,
                    text=stream.output.text,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    usage_estimated=usage.usage_estimated,
                    cost_usd=usage.cost_usd,
                    first_token_ms=usage.first_token_ms,
                )
            ),
            attempt=attempt,
        )
        return Succeeded(outcome, stream.unwritten(), usage)

    async def _stopped(self, job_id: str, attempt: int, why: str) -> BaseException:
        """The call was stopped because the row no longer wants it. A settled row ends the
        attempt as JOB_CLOSED (the workflow has moved on, or takes the row's word); a row
        that is only asked to cancel, or already runs a later attempt, waits for Temporal's
        cancellation, which its next heartbeat brings."""
        activity.logger.info("job %s attempt %d: provider call stopped: %s", job_id, attempt, why)
        job, _prompt = await self._load(job_id)
        if job.state.is_terminal:
            return job_closed(job.state, job.error_kind, job.error_message)
        await asyncio.Event().wait()  # ended by Temporal's cancellation
        raise AssertionError("unreachable")

    async def _end_attempt(self, tail: OutputBatch | None, usage: AttemptUsage) -> None:
        await through_outages("end attempt", lambda: self.projector.end_attempt(tail, usage))
        self._count(usage)

    def _count(self, usage: AttemptUsage) -> None:
        # Org labels only where the operator turned them on (PROMPTJOBS_METRICS_ORG_LABELS).
        metrics.count_usage(usage, usage.org if self.metrics_org_labels else "")

    async def _complete(self, request: AdapterRequest, output: StreamedOutput) -> AttemptResult:
        provider = self.adapters.provider_of(request.options)
        # The provider call's own span: the SDKs' HTTP transports are not all httpx (the
        # OpenAI SDK ships its own fork), so the call is traced here, whatever carries it.
        # With tracing off this is OpenTelemetry's no-op span.
        with TRACER.start_as_current_span(
            f"provider {provider}", kind=trace.SpanKind.CLIENT
        ) as span:
            started = time.monotonic()
            outcome = "ok"
            try:
                adapter = self.adapters.get(request.options)
                return await adapter.complete(request, output)
            except AdapterError as err:
                outcome = err.kind.value
                raise
            except asyncio.CancelledError:
                outcome = JobState.CANCELLED.value
                raise
            except InvalidOptions as err:
                # The label must not carry whatever provider name a client sent.
                provider, outcome = "invalid", ErrorKind.PROVIDER_4XX.value
                raise AdapterError(ErrorKind.PROVIDER_4XX, str(err)) from err
            except Exception as err:
                # Anything an adapter did not classify is `unknown`, which is retried.
                outcome = ErrorKind.UNKNOWN.value
                raise AdapterError(ErrorKind.UNKNOWN, f"{type(err).__name__}: {err}") from err
            finally:
                metrics.ADAPTER_LATENCY.labels(provider=provider, outcome=outcome).observe(
                    time.monotonic() - started
                )
                span.set_attributes(
                    {
                        "promptjobs.provider": provider,
                        "promptjobs.job_id": request.job_id,
                        "promptjobs.attempt": request.attempt,
                        "promptjobs.outcome": outcome,
                    }
                )

    async def _failed_attempt(
        self,
        call: AdapterCall,
        attempt: int,
        err: AdapterError,
        running: DelayedReport,
        tail: OutputBatch | None,
        usage: AttemptUsage,
    ) -> ApplicationError:
        """Ask the lifecycle what this failure leads to; record a re-queue, or leave the end to
        the workflow (which settles the job, showing this attempt's number)."""
        activity.logger.warning("job %s attempt %d: %s", call.job_id, attempt, err.message)
        trace.get_current_span().set_attribute("promptjobs.error_kind", err.kind.value)
        step = next_step(
            FailedAttempt(err.kind, err.message, attempt, call.max_attempts, err.retry_after_s),
            policy=self.backoff,
            now_s=time.time(),
            deadline_s=call.deadline_epoch_s,
            unit_random=random.random(),
        )
        if isinstance(step, End):
            await running.done(send_now=True)
            await self._end_attempt(tail, usage)
            return adapter_failure(step.message, step.kind, non_retryable=True)
        # The re-queue report follows the running one if that is on its way, never precedes
        # it; one not yet sent is dropped.
        await running.done()
        next_at = datetime.now(UTC) + timedelta(seconds=step.delay_s)
        requeue = Transition(
            call.job_id,
            JobState.QUEUED,
            attempt,
            error_kind=err.kind,
            error_message=err.message,
            next_attempt_at=next_at,
        )
        await through_outages(
            "re-queue", lambda: self.projector.apply(requeue, tail=tail, usage=usage)
        )
        self._count(usage)
        await report_to_workflow(AttemptReport(JobState.QUEUED, attempt, err.kind))
        return adapter_failure(err.message, err.kind, delay=timedelta(seconds=step.delay_s))

    async def _load(self, job_id: str) -> tuple[Job, Prompt]:
        return await through_outages("load job", lambda: self._read(job_id))

    async def _read(self, job_id: str) -> tuple[Job, Prompt]:
        async with self.sessions() as session:
            job = await session.get(Job, job_id)
            assert job is not None, job_id
            prompt = await session.get(Prompt, job.prompt_id)
            assert prompt is not None, job.prompt_id
            return job, prompt

    async def _settlement(self, job_id: str, attempt: int) -> AdapterOutcome:
        job, _prompt = await self._load(job_id)
        # The attempt that committed may have died before it woke the chain's children.
        await wake_children(self.sessions, job.prompt_id)
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
        result = await through_outages(
            "settle success",
            lambda: self.projector.succeed(
                job_id, outcome.attempt, response_id, outcome, tail=tail, usage=usage
            ),
        )
        if usage is not None:
            self._count(usage)
        kept = result.state is JobState.SUCCEEDED
        if kept:
            await wake(result.waiting_children)
        return SettleResult(result.applied, result.state, response_id if kept else None)

    @activity.defn(name="check_parents")
    async def check_parents(self, check: CheckParents) -> ParentsCheck:
        """A chain's child: which parents have not succeeded yet (recorded on its row)."""
        state = await check_parents(self.sessions, check.job_id)
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


class DelayedReport:
    """Sends `report` to the workflow after `after_s`, unless the attempt is done by then.

    `done()` settles it before a later report goes out: a report not yet begun is dropped (or
    sent at once, with `send_now`), one already on its way is waited for, so the later report
    is never overtaken.
    """

    def __init__(self, report: AttemptReport, after_s: float) -> None:
        self.report = report
        self.after_s = after_s
        self._sending = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DelayedReport:
        self._task = asyncio.create_task(self._send_later())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.done()

    async def _send_later(self) -> None:
        await asyncio.sleep(self.after_s)
        self._sending = True
        await report_to_workflow(self.report)

    async def done(self, *, send_now: bool = False) -> None:
        if self._task is None:
            return
        if not self._sending:
            self._task.cancel()
            if send_now:
                self._sending = True
                self._task = asyncio.create_task(report_to_workflow(self.report))
        # wait(), not await: our own cancellation must still reach us, the task's must not.
        await asyncio.wait([self._task])
        if not self._task.cancelled() and (error := self._task.exception()) is not None:
            activity.logger.warning("could not report attempt to its workflow: %r", error)


async def report_to_workflow(report: AttemptReport) -> None:
    """Tell the workflow what this attempt did, for its search attributes. The projection is
    the source of truth; a report that cannot be sent costs the operator view, not the job."""
    info = activity.info()
    if info.workflow_id is None:
        return
    try:
        handle = activity.client().get_workflow_handle(info.workflow_id)
        await handle.signal(ATTEMPT_REPORTED, report)
    except RPCError as err:
        activity.logger.warning(
            "could not report attempt to workflow %s: %s", info.workflow_id, err
        )


async def wake_children(sessions: async_sessionmaker[AsyncSession], prompt_id: str) -> None:
    """Tell the waiting jobs of a succeeded prompt's children to check their parents again."""
    await wake(await waiting_children(sessions, prompt_id))


async def wake(job_ids: list[str]) -> None:
    """Tell these waiting jobs to check their parents again. A signal that cannot be sent
    now is sent by the dispatcher's safety net (ready_to_wake)."""
    for job_id in job_ids:
        try:
            await activity.client().get_workflow_handle(job_id).signal(PARENTS_CHANGED)
        except RPCError as err:
            activity.logger.warning("could not wake chained job %s: %s", job_id, err)


def job_closed(
    state: JobState, error_kind: ErrorKind | None, error_message: str | None
) -> ApplicationError:
    """The attempt found its job already settled: nothing to run, nothing to retry. The
    details are the row's word, which the workflow takes (JOB_CLOSED). Benign: a cancel or
    the reconciler got there first, which is no fault."""
    return ApplicationError(
        f"job is already {state.value}",
        state.value,
        error_kind,
        error_message,
        type=JOB_CLOSED,
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,
    )


def adapter_failure(
    message: str, kind: ErrorKind, *, non_retryable: bool = False, delay: timedelta | None = None
) -> ApplicationError:
    """A provider failure as Temporal sees it: its type is the error kind. Benign, because a
    provider failing is the normal business of this service (we log one line ourselves)."""
    return ApplicationError(
        message,
        type=kind.value,
        non_retryable=non_retryable,
        next_retry_delay=delay,
        category=ApplicationErrorCategory.BENIGN,
    )
