"""One attempt of one job on this worker: the provider call, from its request to its end.

An `Attempt` is built once per `call_adapter`, holding the call, the job and its prompt, the
stream of its text, its meter and its "running" report; its methods read like its life:
`run` (the call, streaming), then a success, a failure (`lifecycle.next_step` decides what
it leads to) or one of the three kinds of cancellation `Cancellation` names. What every
attempt of this worker shares (the projector, adapters, prices, backoff) is `AttemptTools`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from opentelemetry import trace
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError

from activities.adapters.base import (
    AdapterRegistry,
    AdapterRequest,
    InvalidOptions,
    StreamedOutput,
)
from activities.adapters.conversation import (
    MESSAGES,
    Message,
    images_of,
    one_message,
    with_user_text,
)
from activities.adapters.options import options_of
from activities.adapters.structured import OutputSchema, check_answer, repair_turn
from activities.budgets import WorkerBudgets, estimate_tokens, input_estimate
from activities.circuits import WorkerCircuits
from activities.contracts import (
    ATTEMPT_REPORTED,
    JOB_CLOSED,
    MOVED_ON,
    PROVIDER_BUSY,
    AdapterCall,
    AdapterOutcome,
    AttemptReport,
)
from activities.errors import AdapterError
from activities.outages import through_outages
from activities.output import AttemptStream, OutputStreams
from activities.prices import PriceTable
from activities.settle import Settling
from projections import metrics
from projections.budgets import Draw
from projections.domain.chains import substitute
from projections.domain.lifecycle import (
    OUTAGE_KINDS,
    AttemptResult,
    BackoffPolicy,
    End,
    ErrorKind,
    JobState,
)
from projections.errors import database_unavailable
from projections.models import Job, Prompt
from projections.projector import Moved, Projector
from projections.store import JobStore
from projections.streams import AttemptUsage, OutputBatch

TRACER = trace.get_tracer("promptjobs.activities")
# The outcomes of a call its provider refused as a client's error: the model may not exist
# there, so a probe that ended so keeps no budget for it.
UNANSWERED = frozenset({ErrorKind.PROVIDER_4XX.value, ErrorKind.AUTH.value})


@dataclass(frozen=True)
class AttemptTools:
    """What every attempt of this worker uses, given once (tests hand in their own)."""

    store: JobStore
    adapters: AdapterRegistry
    backoff: BackoffPolicy
    streams: OutputStreams
    prices: PriceTable
    worker: str
    budgets: WorkerBudgets
    circuits: WorkerCircuits
    metrics_org_labels: bool = False

    @property
    def projector(self) -> Projector:
        return self.store.projector

    @property
    def settling(self) -> Settling:
        """Where this worker's attempts are settled (activities/settle.py)."""
        return Settling(self.store, self.backoff, self.metrics_org_labels)

    async def load(self, job_id: str) -> tuple[Job, Prompt]:
        return await through_outages("load job", lambda: self.store.job_and_prompt(job_id))


async def adapter_request(
    store: JobStore, job: Job, prompt: Prompt, attempt: int
) -> AdapterRequest:
    """What attempt `attempt` of `job` asks its adapter (a call, or a provider batch's line)."""
    text = prompt.text
    options, unrunnable = options_of(job, prompt)
    messages: list[Message] = []
    if prompt.messages is not None:
        try:
            messages = MESSAGES.validate_python(prompt.messages)
        except ValidationError as err:
            unrunnable = unrunnable or f"messages: {err.errors()[0]['msg']}"
    if prompt.after:
        # A chain's child runs with its parents' answers in place of the placeholders.
        answers = await store.chains.parent_answers(prompt.after)

        def answered(said: str) -> str:
            return substitute(said, prompt.after or [], answers)

        text = answered(text)
        messages = with_user_text(messages, answered)
    if options.output_schema is not None and attempt > 1:
        missed = await store.last_miss(job.job_id, attempt)
        if missed is not None:
            # The answer that missed the schema and why, so the model can mend it.
            turn = repair_turn(str(missed.get("answer", "")), list(missed.get("errors", [])))
            messages = [*(messages or one_message(text)), *MESSAGES.validate_python(turn)]
    return AdapterRequest(
        job_id=job.job_id,
        prompt_id=prompt.prompt_id,
        prompt=text,
        attempt=attempt,
        options=options,
        unrunnable=unrunnable,
        messages=messages,
    )


def checked(wanted: OutputSchema | None, result: AttemptResult, text: str) -> AttemptResult:
    """The result with its JSON (`text`, its answer as streamed), for a job with an output
    schema (an answer of tool calls is not checked: the model asked for tools first); a
    miss is a `schema_mismatch` failure that keeps the answer and the errors for the next
    attempt's repair turn. A direct call's answer and a provider batch's line alike."""
    if wanted is None or result.tool_calls:
        return result
    value, miss = check_answer(wanted, text, result.finish_reason)
    metrics.SCHEMA_CHECKS.labels(
        provider=result.provider, model=result.model[:64], outcome="miss" if miss else "match"
    ).inc()
    if miss is not None:
        detail = {"answer": text, "errors": miss.errors}
        raise AdapterError(ErrorKind.SCHEMA_MISMATCH, miss.message, detail=detail)
    return replace(result, output_json=value)


@dataclass(frozen=True)
class Succeeded:
    """A successful call: what it produced, the streamed text not written yet, and the
    attempt's usage record."""

    outcome: AdapterOutcome
    tail: OutputBatch | None
    usage: AttemptUsage


class Cancellation(StrEnum):
    """Why an attempt's call was cancelled, which decides what the attempt does next."""

    # The job's row no longer wants the call (cancelled, or taken over by a later attempt):
    # nobody waits for it, so the attempt reads the row and ends as it says.
    STOPPED_BY_ROW = "stopped by its row"
    # The workflow asked (the job is being cancelled): keep what was streamed and consumed.
    REQUESTED = "requested"
    # The worker's shutdown grace ran out mid-call: a worker_crash, re-queued elsewhere now.
    WORKER_SHUTDOWN = "worker shutdown"


def cancellation(
    stopped_by_row: bool, cancelling: bool, details: activity.ActivityCancellationDetails | None
) -> Cancellation:
    """Tell the three apart: the row's stop cancels only the call's task (ours is not being
    cancelled); Temporal's cancellation cancels ours, and says whether the worker shut down
    without anyone asking."""
    if stopped_by_row and not cancelling:
        return Cancellation.STOPPED_BY_ROW
    if details is not None and details.worker_shutdown and not details.cancel_requested:
        return Cancellation.WORKER_SHUTDOWN
    return Cancellation.REQUESTED


class AttemptMeter:
    """Times one attempt and makes its usage record: the provider's counts where it gave
    them, estimates where it did not (flagged), and the cost by the worker's price table."""

    def __init__(
        self,
        adapters: AdapterRegistry,
        prices: PriceTable,
        org: str,
        request: AdapterRequest,
        output: StreamedOutput,
    ) -> None:
        self.adapters = adapters
        self.prices = prices
        self.org = org
        self.request = request
        self.output = output
        self.began = time.monotonic()
        self.began_at = datetime.now(UTC)
        # Why a deferrable job's call was made directly (AdapterCall.via), for its record.
        self.via: str | None = None

    def usage(self, outcome: str, result: AttemptResult | None = None) -> AttemptUsage:
        output = self.output
        options = self.request.options
        provider = result.provider if result else self.adapters.provider_of(options)
        model = result.model if result else self.adapters.model_of(options)
        given_in = result.input_tokens if result else output.input_tokens
        given_out = result.output_tokens if result else output.output_tokens
        estimated = output.usage_estimated or bool(result and result.usage_estimated)
        if given_in is None:
            images = len(images_of(self.request.messages))
            given_in = input_estimate(self.request.prompt, options, images)
            estimated = True
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
            cost_usd=self.prices.cost(model, given_in, given_out),
            output_chars=output.length,
            first_token_ms=None if first is None else round((first - origin) * 1000),
            duration_ms=round((time.monotonic() - self.began) * 1000),
            started_at=self.began_at,
            ended_at=datetime.now(UTC),
            via=self.via,
        )


class Attempt:
    """Attempt `number` of the job `call` names, on this worker (see the module's text)."""

    def __init__(
        self,
        tools: AttemptTools,
        call: AdapterCall,
        number: int,
        job: Job,
        prompt: Prompt,
        running: DelayedReport,
        draw: Draw | None = None,
        *,
        probing: bool = False,
        moved: Moved | None = None,
    ) -> None:
        self.tools = tools
        self.call = call
        self.number = number
        self.job = job
        self.prompt = prompt
        self.running = running
        # What the attempt drew on its provider budget as it started, if it has one; whether
        # it is the call that learns its provider's limits (projections/budgets.py, probes).
        self.draw = draw
        self.probing = probing
        # Where the attempt started instead of the job's place, and why.
        self.moved = moved
        # How many places the job may run at (its own and its fallbacks').
        self.places = 1
        self._calling: asyncio.Task[AttemptResult] | None = None

    @property
    def budget(self) -> str:
        """The provider budget the job asked for: what the call drew on, and where what the
        provider says of its limits belongs, whatever name its answer gives the model (OpenAI
        answers gpt-4o-mini as gpt-4o-mini-2024-07-18)."""
        return self.draw.budget if self.draw else self.tools.budgets.name_of(self.job, self.prompt)

    async def run(self) -> Succeeded:
        """The adapter call, streaming its text to the projection as it comes. It ends in a
        success (returned with the text not yet written and the attempt's usage), a failure
        (recorded, and raised for Temporal), a cancellation, or a stop: the job's row says
        the call is no longer wanted, and the provider's stream is closed at once instead of
        at Temporal's next heartbeat."""
        # On the attempt's activity span (a no-op span while tracing is off).
        trace.get_current_span().set_attributes(
            {
                "promptjobs.job_id": self.job.job_id,
                "promptjobs.org": self.job.org,
                "promptjobs.attempt": self.number,
            }
        )
        request = await self._request()
        self.places = len(request.options.fallbacks or ()) + 1
        stream = self.tools.streams.open(self.job.job_id, self.number, self._stop)
        meter = AttemptMeter(
            self.tools.adapters, self.tools.prices, self.job.org, request, stream.output
        )
        meter.via = self.call.via or (self.moved.why if self.moved else None)
        self._calling = asyncio.create_task(self._complete(request, stream.output))
        try:
            try:
                result = await self._calling
            finally:
                # No more flushes of it; what it has not written goes with the attempt's end.
                await self.tools.streams.close(stream)
        except AdapterError as err:
            usage = replace(meter.usage(err.kind.value), detail=err.detail)
            if err.kind is ErrorKind.RATE_LIMIT and self.call.budget:
                raise await self._paused(err, request, stream, usage) from err
            await self._ended(usage, stream)
            raise await self._failed(err, stream.unwritten(), usage) from err
        except asyncio.CancelledError:
            own = asyncio.current_task()
            why = cancellation(
                stream.stopped is not None,
                own is not None and own.cancelling() > 0,
                activity.cancellation_details(),
            )
            instead = await self._cancelled(why, stream, meter)
            if instead is None:
                raise
            raise instead from None
        done = self._succeeded(result, stream, meter)
        await self._ended(done.usage, stream)
        return done

    async def _ended(
        self, usage: AttemptUsage, stream: AttemptStream, *, drew: bool = True
    ) -> None:
        """Tell the budget what the call cost (its draw reconciled; `drew` False: the
        provider refused it, and its draw was given back) and what the provider said of its
        limits. Best effort: with the database unreachable the attempt goes on to its end
        (a draw keeps its estimate until it leaves the window; a probe times out)."""
        name = self.budget
        try:
            await self.tools.circuits.after_call(name, usage.outcome)
            await self.tools.budgets.after_call(
                name,
                self.job.job_id,
                self.number,
                drew=drew and self.draw is not None,
                counted=drew,
                probing=self.probing,
                answered=usage.outcome not in UNANSWERED,
                started_at=usage.started_at,
                tokens=(usage.input_tokens or 0) + (usage.output_tokens or 0),
                output_tokens=usage.output_tokens or 0,
                limits=stream.output.limits,
            )
        except Exception as err:
            if not database_unavailable(err):
                raise
            activity.logger.warning(
                "job %s attempt %d: budget %s not updated, database unavailable: %s",
                self.job.job_id, self.number, name, err.__class__.__name__,
            )  # fmt: skip

    async def _request(self) -> AdapterRequest:
        return await adapter_request(self.tools.store, self.job, self.prompt, self.number)

    def _stop(self, why: str) -> None:
        """The job's row no longer wants the call (the stream's watch says so)."""
        if self._calling is not None:
            self._calling.cancel(why)

    def _succeeded(
        self, result: AttemptResult, stream: AttemptStream, meter: AttemptMeter
    ) -> Succeeded:
        if result.text != stream.output.text:
            if stream.output.length:
                activity.logger.warning(
                    "job %s: the %s adapter's text differs from what it streamed; the streamed "
                    "text stands",
                    self.job.job_id,
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
            attempt=self.number,
        )
        return Succeeded(outcome, stream.unwritten(), usage)

    async def _cancelled(
        self, why: Cancellation, stream: AttemptStream, meter: AttemptMeter
    ) -> BaseException | None:
        """What a cancelled call leads to: the exception to raise instead of the cancellation,
        or None to let the cancellation itself go on."""
        if why is Cancellation.STOPPED_BY_ROW:
            usage = meter.usage(JobState.CANCELLED.value)
            await self.tools.settling.usage(usage, stream.unwritten())
            await self._ended(usage, stream)
            assert stream.stopped is not None
            return await self._stopped(stream.stopped)
        if why is Cancellation.REQUESTED:
            # What the call streamed and consumed is kept, however often the cancel is
            # repeated meanwhile.
            usage = meter.usage(JobState.CANCELLED.value)
            await asyncio.shield(self.tools.settling.usage(usage, stream.unwritten()))
            await asyncio.shield(self._ended(usage, stream))
            return None
        # Reported as a cancellation this would be refused (nobody asked) and the attempt
        # would idle until its heartbeat timed out; as a worker_crash it is re-queued now and
        # runs on another worker.
        lost = AdapterError(
            ErrorKind.WORKER_CRASH,
            f"attempt {self.number} cut off: worker {self.tools.worker} shut down mid-call",
        )
        return await self._failed(lost, stream.unwritten(), meter.usage(lost.kind.value))

    async def _stopped(self, why: str) -> BaseException:
        """The call was stopped because the row no longer wants it. A settled row ends the
        attempt as JOB_CLOSED (the workflow has moved on, or takes the row's word); a row
        that is only asked to cancel, or already runs a later attempt, waits for Temporal's
        cancellation, which its next heartbeat brings."""
        activity.logger.info(
            "job %s attempt %d: provider call stopped: %s", self.job.job_id, self.number, why
        )
        job, _prompt = await self.tools.load(self.job.job_id)
        if job.state.is_terminal:
            return job_closed(job.state, job.error_kind, job.error_message)
        await asyncio.Event().wait()  # ended by Temporal's cancellation
        raise AssertionError("unreachable")

    async def _complete(self, request: AdapterRequest, output: StreamedOutput) -> AttemptResult:
        adapters = self.tools.adapters
        provider = adapters.provider_of(request.options)
        # The provider call's own span: the SDKs' HTTP transports are not all httpx (the
        # OpenAI SDK ships its own fork), so the call is traced here, whatever carries it.
        # With tracing off this is OpenTelemetry's no-op span.
        with TRACER.start_as_current_span(
            f"provider {provider}", kind=trace.SpanKind.CLIENT
        ) as span:
            started = time.monotonic()
            outcome = "ok"
            try:
                adapter = adapters.check(request)
                result = await adapter.complete(request, output)
                text = output.text if output.length else result.text
                return checked(request.options.output_schema, result, text)
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

    async def _paused(
        self, err: AdapterError, request: AdapterRequest, stream: AttemptStream, usage: AttemptUsage
    ) -> ApplicationError:
        """The provider answered 429: its budget pauses for every worker until its
        Retry-After (else the policy's rate-limit wait), and the job waits queued for it
        without spending this attempt (its workflow gives the job one more). A 429 the fake
        provider was told to inject is the job's own: it pauses nothing (unless an operator
        gave the fake a budget), so one test job does not stall every other."""
        call, tools = self.call, self.tools
        name = self.budget
        shared = self.draw is not None or tools.adapters.learns_limits(request.options)
        wait_s = (
            err.retry_after_s
            if err.retry_after_s is not None
            else tools.backoff.delay_s(
                err.kind, self.number, retry_after_s=None, unit_random=random.random()
            )
        )
        activity.logger.info(
            "job %s attempt %d: %s; %s for %.1f s, the attempt is not counted",
            call.job_id, self.number, err.message,
            f"budget {name} paused" if shared else "waiting", wait_s,
        )  # fmt: skip
        if shared:
            until = await through_outages(
                "pause budget",
                lambda: tools.budgets.rate_limited(name, call.job_id, self.number, wait_s),
            )
            paused = f"; provider budget {name} paused until {until:%H:%M:%S} UTC"
        else:
            until, paused = datetime.now(UTC) + timedelta(seconds=wait_s), ""
        await self._ended(usage, stream, drew=False)
        await self.running.done()
        message = f"{err.message}{paused} (not counted against max_attempts)"
        await tools.settling.requeue(
            call.job_id,
            self.number,
            err.kind,
            message,
            at=until,
            usage=usage,
            tail=stream.unwritten(),
        )
        await report_to_workflow(AttemptReport(JobState.QUEUED, self.number, err.kind))
        return provider_busy(message, self.number, wait_s)

    async def _failed(
        self, err: AdapterError, tail: OutputBatch | None, usage: AttemptUsage
    ) -> ApplicationError:
        """Ask the lifecycle what this failure leads to; record a re-queue, or leave the end to
        the workflow (which settles the job, showing this attempt's number)."""
        call, tools = self.call, self.tools
        activity.logger.warning("job %s attempt %d: %s", call.job_id, self.number, err.message)
        trace.get_current_span().set_attribute("promptjobs.error_kind", err.kind.value)
        settling = tools.settling
        places = self.places
        step = settling.next_step(
            err.kind,
            err.message,
            self.number,
            call.max_attempts,
            retry_after_s=err.retry_after_s,
            deadline_s=call.deadline_epoch_s,
            elsewhere=places > 1,
            reason=err.reason,
            outage_streak=await self._outage_streak(err.kind, usage) if places > 1 else 0,
        )
        if isinstance(step, End):
            await self.running.done(send_now=True)
            await settling.usage(usage, tail)
            return adapter_failure(step.message, step.kind, non_retryable=True)
        fallback = None
        if step.moved_on is not None:
            fallback = (self.job.fallback + 1) % places
            usage = replace(usage, detail={**(usage.detail or {}), "moved_on": step.moved_on})
            activity.logger.warning(
                "job %s attempt %d: moving on to its place %d: %s",
                call.job_id, self.number, fallback, step.moved_on,
            )  # fmt: skip
        # The re-queue report follows the running one if that is on its way, never precedes
        # it; one not yet sent is dropped.
        await self.running.done()
        await settling.requeue(
            call.job_id,
            self.number,
            err.kind,
            err.message,
            delay_s=step.delay_s,
            usage=usage,
            tail=tail,
            fallback=fallback,
        )
        await report_to_workflow(AttemptReport(JobState.QUEUED, self.number, err.kind))
        delay = timedelta(seconds=step.delay_s)
        if not err.kind.is_retryable:
            # A client error that moves the job on: retried elsewhere, though its kind is
            # not retried in place (the workflow's retry policy names the kinds it is not).
            return adapter_failure(err.message, MOVED_ON, delay=delay)
        return adapter_failure(err.message, err.kind, delay=delay)

    async def _outage_streak(self, kind: ErrorKind, usage: AttemptUsage) -> int:
        """How many outage failures in a row this attempt's place has given the job, this
        one included (the attempt before, if it ran at the same place and failed so)."""
        if kind not in OUTAGE_KINDS:
            return 0
        before = await through_outages(
            "read the attempt before",
            lambda: self.tools.store.attempt_record(self.job.job_id, self.number - 1),
        )
        if before is None or (before.provider, before.model) != (usage.provider, usage.model):
            return 1
        return 2 if before.outcome in OUTAGE_KINDS else 1


# -- what an attempt tells Temporal and its workflow ---------------------------------------


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


def provider_busy(
    message: str, attempt: int | None, wait_s: float, made: int | None = None
) -> ApplicationError:
    """The call does not fit its provider budget now, or the provider said 429 to it
    (`attempt`: the attempt that got it, which the job is not charged for): the workflow
    waits about `wait_s` for room, or for the dispatcher's wake, and asks again. `made`:
    the attempts the job has made before the refused one, where Temporal's retries of the
    activity (a worker lost mid-call) made more than the workflow counted. Benign: a busy
    provider is the normal business of this service."""
    return ApplicationError(
        message,
        attempt,
        wait_s,
        made,
        type=PROVIDER_BUSY,
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,
    )


def adapter_failure(
    message: str,
    kind: ErrorKind | str,
    *,
    non_retryable: bool = False,
    delay: timedelta | None = None,
) -> ApplicationError:
    """A provider failure as Temporal sees it: its type is the error kind. Benign, because a
    provider failing is the normal business of this service (we log one line ourselves)."""
    return ApplicationError(
        message,
        type=str(kind),
        non_retryable=non_retryable,
        next_retry_delay=delay,
        category=ApplicationErrorCategory.BENIGN,
    )
