"""One job's line of a provider batch, as it is settled: `BatchLine` is to a batch's attempt
what `Attempt` (activities/attempt.py) is to a direct call. Its answer, its error or its
absence becomes the job's success, re-queue or failure through `Settling`
(activities/settle.py), with the attempt's usage at the batch's price."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from pydantic import ValidationError

from activities.adapters.batch import LineResult
from activities.adapters.options import PromptOptions, targets
from activities.adapters.structured import OutputSchema
from activities.attempt import checked
from activities.budgets import estimate_tokens
from activities.contracts import BatchVerdict
from activities.deferral import DIRECTLY
from activities.errors import AdapterError
from activities.job_activities import wake
from activities.outages import through_outages
from activities.prices import PriceTable
from activities.settle import Settling
from projections.domain.lifecycle import End, ErrorKind, JobState
from projections.models import Job, ProviderBatch, job_options
from projections.provider_batches import Member
from projections.store import JobStore
from projections.streams import AttemptUsage, OutputBatch

# The provider status of a batch the provider no longer answers for (HTTP 404 and the like).
LOST = "lost"


def via_batch(batch: ProviderBatch) -> str:
    """What a job's attempt record says of the batch it ran in."""
    return f"provider batch {batch.batch_id} ({batch.provider} {batch.provider_batch_id})"


@dataclass(frozen=True)
class BatchLine:
    """`member`'s result `line` in `batch` (a LineResult without result or error: the
    provider did not run it)."""

    batch: ProviderBatch
    member: Member
    line: LineResult
    settling: Settling
    prices: PriceTable
    store: JobStore

    @property
    def job(self) -> Job:
        return self.member.job

    async def usage(self, attempt: int) -> AttemptUsage:
        """The attempt's usage record: the provider's counts (else estimated), its batch
        price, and the batch's time from its send to now."""
        batch, member, line = self.batch, self.member, self.line
        result, now = line.result, datetime.now(UTC)
        began = batch.sent_at or now
        input_tokens = result.input_tokens if result else None
        output_tokens = result.output_tokens if result else None
        estimated = result is not None and (input_tokens is None or output_tokens is None)
        if result is not None and input_tokens is None:
            # Read only here: settling does not hold a batch's prompts.
            _job, prompt = await self.store.job_and_prompt(member.job.job_id)
            input_tokens = estimate_tokens(prompt.text)
        if result is not None and output_tokens is None:
            output_tokens = estimate_tokens(result.text)
        model = result.model if result else batch.model
        error = line.error
        return AttemptUsage(
            job_id=member.job.job_id,
            attempt=attempt,
            org=member.job.org,
            outcome=JobState.SUCCEEDED.value
            if result
            else (error.kind.value if error else "unrun"),
            provider=batch.provider[:32],
            model=model[:128],
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            usage_estimated=estimated,
            cost_usd=self.prices.cost(model, input_tokens, output_tokens, batch=True)
            if result
            else None,
            output_chars=len(result.text) if result else 0,
            first_token_ms=None,
            duration_ms=round((now - began).total_seconds() * 1000),
            started_at=began,
            ended_at=now,
            via=via_batch(batch)[:255],
        )

    async def succeeded(self, attempt: int) -> BatchVerdict:
        """A line with its answer: the job succeeds with it, as a direct call's would, once
        the answer matches the job's output schema if it has one (a miss runs again
        directly, charged this attempt, with the repair turn a direct miss gets)."""
        line = self.line
        assert line.result is not None
        job_id = self.job.job_id
        usage = await self.usage(attempt)
        try:
            answer = checked(self.output_schema, line.result, line.result.text)
        except AdapterError as miss:
            missed = replace(usage, outcome=miss.kind.value, detail=miss.detail)
            return await self._failed(attempt, miss, missed)
        result = replace(
            answer,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            usage_estimated=usage.usage_estimated,
            cost_usd=usage.cost_usd,
            latency_ms=usage.duration_ms,
        )
        tail = OutputBatch(job_id, attempt, 0, result.text, result.tool_calls)
        applied = await self.settling.succeed(job_id, attempt, result, tail=tail, usage=usage)
        if applied.state is JobState.SUCCEEDED:
            await wake(applied.waiting_children)
        return settled_verdict(await self._row())

    async def failed(self, attempt: int) -> BatchVerdict:
        """A line's error, as a direct call's: a 429 costs no attempt and the job runs
        directly at once; a retryable kind runs directly after the backoff's delay; the
        rest (or attempts spent) fail the job."""
        err = self.line.error
        assert err is not None
        return await self._failed(attempt, err, await self.usage(attempt))

    @property
    def output_schema(self) -> OutputSchema | None:
        """The job's output schema, if its options ask for one."""
        wanted = (self.job.options or {}).get("output_schema")
        return None if wanted is None else OutputSchema.model_validate(wanted)

    async def _failed(self, attempt: int, err: AdapterError, usage: AttemptUsage) -> BatchVerdict:
        job, batch = self.job, self.batch
        message = f"{err.message} (in {via_batch(batch)})"
        via = f"{DIRECTLY}: its line in {via_batch(batch)} failed ({err.kind.value})"
        if err.kind is ErrorKind.RATE_LIMIT:
            delay, spared = err.retry_after_s or 0.0, 1
        else:
            step = self.settling.next_step(
                err.kind, message, attempt, job.max_attempts, retry_after_s=err.retry_after_s
            )
            if isinstance(step, End):
                await self.settling.fail(job.job_id, step.kind, step.message, usage=usage)
                return settled_verdict(await self._row())
            delay, spared = step.delay_s, 0
        await self.settling.requeue(
            job.job_id, attempt, err.kind, message, delay_s=delay, usage=usage
        )
        return BatchVerdict(False, JobState.QUEUED, attempt, spared, delay, via)

    async def not_run(self) -> BatchVerdict:
        """The provider ended the batch without running the line (expired, cancelled): the
        job runs directly now, and the batch's attempt, if it began one, is not charged."""
        job, batch = self.job, self.batch
        ended = "was lost at the provider" if batch.provider_status == LOST else "ended"
        why = f"{via_batch(batch)} {ended} without running it"
        if batch.provider_status not in (None, LOST):
            why = f"{via_batch(batch)} ended {batch.provider_status} without running it"
        # As an outage does, it moves the job on to its next place, if it has one.
        place = await self._next_place()
        moved = None if place is None else f"{why}: moved on to its place {place[0]}, {place[1]}"
        if job.state is not JobState.RUNNING:
            # What its line held under a spend cap is given back: the call was not made.
            await self.store.spend_caps.release(job.job_id, job.attempt + 1)
            if place is not None:
                await self.store.provider_batches.move_on(job.job_id, place[0])
            return BatchVerdict(False, job.state, job.attempt, via=f"{DIRECTLY}: {moved or why}")
        usage = replace(
            await self.usage(job.attempt),
            outcome=ErrorKind.TIMEOUT.value,
            detail=None if moved is None else {"moved_on": moved},
        )
        await self.settling.requeue(
            job.job_id,
            job.attempt,
            ErrorKind.TIMEOUT,
            why,
            usage=usage,
            counted=False,
            fallback=None if place is None else place[0],
        )
        return BatchVerdict(
            False, JobState.QUEUED, job.attempt, 1, via=f"{DIRECTLY}: {moved or why}"
        )

    async def _next_place(self) -> tuple[int, str] | None:
        """The job's next place (`options.fallbacks`) and its name, if it has another."""
        job_id = self.job.job_id
        job, prompt = await through_outages("load job", lambda: self.store.job_and_prompt(job_id))
        try:
            places = targets(PromptOptions.model_validate(job_options(job, prompt)))
        except ValidationError:
            return None
        if len(places) < 2:
            return None
        index = (job.fallback + 1) % len(places)
        there = places[index]
        return index, f"{there.provider or 'the default provider'}/{there.model or 'its model'}"

    async def _row(self) -> Job:
        """The job's row as settling left it."""
        job_id = self.job.job_id
        job, _prompt = await through_outages("load job", lambda: self.store.job_and_prompt(job_id))
        return job


def settled_verdict(job: Job) -> BatchVerdict:
    return BatchVerdict(
        True,
        job.state,
        job.attempt,
        response_id=job.response_id,
        error_kind=job.error_kind,
        error_message=job.error_message,
    )
