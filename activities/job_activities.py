"""The job's activities: the adapter call (heartbeating, reporting each attempt) and settling."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError

from activities.adapters.base import AdapterRegistry, AdapterRequest, AdapterResult, InvalidOptions
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
from activities.errors import AdapterError, BackoffPolicy, ErrorKind
from projections.ids import response_id_for
from projections.models import Job, Prompt
from projections.projector import Projector, ResponseRecord, Transition
from projections.states import JobState


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@asynccontextmanager
async def heartbeating(interval_s: float) -> AsyncIterator[None]:
    """Heartbeat while the body runs: a dead worker stops heartbeating, and Temporal then
    retries the attempt elsewhere. Heartbeats also carry cancellation into the activity."""

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()


class JobActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        projector: Projector,
        adapters: AdapterRegistry,
        backoff: BackoffPolicy,
        worker: str | None = None,
    ) -> None:
        self.sessions = sessions
        self.projector = projector
        self.adapters = adapters
        self.backoff = backoff
        self.worker = worker or worker_identity()

    @activity.defn(name="call_adapter")
    async def call_adapter(self, call: AdapterCall) -> AdapterOutcome:
        """One attempt. Temporal runs the attempts; each reports its start and its failure to
        the projector so clients see running → queued → running with the error and the time
        of the next attempt. The workflow settles the job."""
        info = activity.info()
        attempt = info.attempt
        timeout = info.heartbeat_timeout or timedelta(seconds=10)
        # From the first line: under load the projection writes can wait on the database for
        # longer than the heartbeat timeout, and a live worker must not be taken for dead.
        async with heartbeating(max(0.2, timeout.total_seconds() / 4)):
            started = await self.projector.start_attempt(call.job_id, attempt, self.worker)
            if started.state.is_terminal:
                raise ApplicationError(
                    f"job is already {started.state.value}", type=JOB_CLOSED, non_retryable=True
                )
            await report_to_workflow(AttemptReport(JobState.RUNNING.value, attempt))
            job, prompt = await self._load(call.job_id)
            request = AdapterRequest(
                job_id=job.job_id,
                prompt_id=prompt.prompt_id,
                prompt=prompt.text,
                attempt=attempt,
                options=dict(prompt.options or {}),
            )
            try:
                result = await self._complete(request)
            except AdapterError as err:
                raise await self._failed_attempt(call, attempt, err) from err
        return _outcome(attempt, result)

    async def _complete(self, request: AdapterRequest) -> AdapterResult:
        try:
            adapter = self.adapters.get(request.options)
            return await adapter.complete(request)
        except (AdapterError, asyncio.CancelledError):
            raise
        except InvalidOptions as err:
            raise AdapterError(ErrorKind.PROVIDER_4XX, str(err)) from err
        except Exception as err:
            # Anything an adapter did not classify is `unknown`, which is retried.
            raise AdapterError(ErrorKind.UNKNOWN, f"{type(err).__name__}: {err}") from err

    async def _failed_attempt(
        self, call: AdapterCall, attempt: int, err: AdapterError
    ) -> ApplicationError:
        """Decide, by the shared policy, whether Temporal retries; record the re-queue."""
        message = err.message
        activity.logger.warning("job %s attempt %d: %s", call.job_id, attempt, message)
        if not err.kind.is_retryable or attempt >= call.max_attempts:
            return adapter_failure(message, err.kind, non_retryable=True)
        delay = self.backoff.delay_s(
            err.kind, attempt, retry_after_s=err.retry_after_s, unit_random=random.random()
        )
        if time.time() + delay >= call.deadline_epoch_s:
            return adapter_failure(
                f"the next attempt would start after the job's hard ceiling; last error "
                f"({err.kind.value}): {message}",
                ErrorKind.STUCK,
                non_retryable=True,
            )
        next_at = datetime.now(UTC) + timedelta(seconds=delay)
        await self.projector.apply(
            Transition(
                call.job_id,
                JobState.QUEUED,
                attempt,
                error_kind=err.kind.value,
                error_message=message,
                next_attempt_at=next_at,
            )
        )
        await report_to_workflow(AttemptReport(JobState.QUEUED.value, attempt, err.kind.value))
        return adapter_failure(message, err.kind, delay=timedelta(seconds=delay))

    async def _load(self, job_id: str) -> tuple[Job, Prompt]:
        async with self.sessions() as session:
            job = await session.get(Job, job_id)
            assert job is not None, job_id
            prompt = await session.get(Prompt, job.prompt_id)
            assert prompt is not None, job.prompt_id
            return job, prompt

    @activity.defn(name="finalize_success")
    async def finalize_success(self, final: FinalizeSuccess) -> SettleResult:
        """Persist the response and mark the job succeeded, if the attempt is still current."""
        outcome = final.outcome
        job, _prompt = await self._load(final.job_id)
        response_id = response_id_for(job.prompt_id, outcome.provider_request_id, job.job_id)
        record = ResponseRecord(
            text=outcome.text,
            provider=outcome.provider,
            model=outcome.model,
            provider_request_id=outcome.provider_request_id,
            finish_reason=outcome.finish_reason,
            input_tokens=outcome.input_tokens,
            output_tokens=outcome.output_tokens,
            latency_ms=outcome.latency_ms,
        )
        result = await self.projector.succeed(final.job_id, outcome.attempt, response_id, record)
        kept = result.state is JobState.SUCCEEDED
        return SettleResult(result.applied, result.state.value, response_id if kept else None)

    @activity.defn(name="settle_job")
    async def settle_job(self, settle: SettleJob) -> SettleResult:
        result = await self.projector.apply(
            Transition(
                settle.job_id,
                JobState(settle.state),
                error_kind=settle.error_kind,
                error_message=settle.error_message,
            )
        )
        return SettleResult(result.applied, result.state.value)


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


def _outcome(attempt: int, result: AdapterResult) -> AdapterOutcome:
    return AdapterOutcome(
        attempt=attempt,
        text=result.text,
        provider=result.provider,
        model=result.model,
        provider_request_id=result.provider_request_id,
        finish_reason=result.finish_reason,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        latency_ms=result.latency_ms,
    )
