"""The activities of provider batches (issue 33; a deferrable job's own `defer_job` is in
activities/deferral.py).

`submit_provider_batch`, `poll_provider_batch`, `settle_provider_batch` (a batch's workflow,
workflows/provider_batch.py): send the batch once, follow it, and settle each job from its
own result line as a direct attempt would have been, through the same projector. Each is
safe to repeat: a send first looks for the batch sent before under our id; settling reads
what the batch already did to each job (DeferredJob.attempt, .verdict) and tells it again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.service import RPCError, RPCStatusCode

from activities.adapters.base import AdapterRegistry, AdapterRequest, InvalidOptions
from activities.adapters.batch import (
    BatchAPI,
    BatchUnsupported,
    LineResult,
    UnreadableLine,
    batch_api_of,
)
from activities.adapters.conversation import count_images
from activities.adapters.options import PromptOptions, options_of
from activities.attempt import adapter_request
from activities.batch_line import LOST, BatchLine, settled_verdict, via_batch
from activities.budgets import answer_estimate, call_cost
from activities.contracts import (
    ATTEMPT_REPORTED,
    BATCH_DONE,
    AttemptReport,
    BatchPoll,
    BatchSent,
    BatchSettled,
    BatchVerdict,
    ProviderBatchRef,
)
from activities.deferral import DIRECTLY
from activities.errors import AdapterError
from activities.outages import through_outages
from activities.prices import PriceTable
from activities.settle import Settling
from projections.domain.lifecycle import (
    BackoffPolicy,
    ErrorKind,
    JobState,
)
from projections.errors import database_unavailable
from projections.models import Job, ProviderBatch
from projections.provider_batches import Member
from projections.spend import Caps
from projections.store import JobStore

# The jobs of a batch read with their prompts at once, while it is sent: memory stays in
# proportion to a page, not to the batch.
PAGE = 500
# A batch's requests at most, in bytes: under OpenAI's 200 MB input file and Anthropic's
# 256 MB batch request. The jobs past it wait for the next batch.
BATCH_BYTES = 180 * 2**20


# A batch step's failure that nobody classified (a provider answer no adapter expected, a
# bug) is retried this many times, then the step ends its own way (below): the provider
# being down or the database away is retried for as long as it lasts, an unknown never is.
UNKNOWN_TRIES = 5


def gave_up_on(err: Exception) -> bool:
    """Whether `err` is unclassified and the step has retried it UNKNOWN_TRIES times."""
    if isinstance(err, AdapterError | BatchUnsupported | RPCError) or database_unavailable(err):
        return False
    return activity.info().attempt >= UNKNOWN_TRIES


def request_bytes(request: AdapterRequest) -> int:
    """About what one line of a batch takes: its text, its system text and the rest."""
    system = request.options.system or ""
    return len(request.prompt.encode()) + len(system.encode()) + 512


class BatchActivities:
    def __init__(
        self,
        store: JobStore,
        adapters: AdapterRegistry,
        backoff: BackoffPolicy,
        prices: PriceTable,
        metrics_org_labels: bool = False,
        *,
        caps_allow_unpriced: bool = False,
    ) -> None:
        self.store = store
        # A line under a spend cap on a model without a price holds nothing if allowed.
        self.allow_unpriced = caps_allow_unpriced
        self.settling = Settling(store, backoff, metrics_org_labels)
        self.batches = store.provider_batches
        self.adapters = adapters
        self.prices = prices

    # -- a provider batch's workflow -----------------------------------------------------

    def _api(self, batch: ProviderBatch) -> BatchAPI | None:
        try:
            return batch_api_of(self.adapters.get(PromptOptions(provider=batch.provider)))
        except InvalidOptions:
            return None

    @activity.defn(name="submit_provider_batch")
    async def submit_provider_batch(self, ref: ProviderBatchRef) -> BatchSent:
        """Send the batch's still-queued jobs as one provider batch, once: a repeat finds the
        batch recorded, or the provider's batch tagged with our id, and adopts it."""
        batch = await self.batches.get(ref.batch_id)
        if batch.provider_batch_id is not None:
            return BatchSent(batch.provider_batch_id)
        if batch.state in ("unsupported", "refused"):
            return BatchSent(direct=batch.note or "")
        api = self._api(batch)
        if api is None:
            return await self._unsent(batch, "unsupported", f"provider {batch.provider} is gone")
        try:
            found = await self._sent_before(api, batch)
            if found is None:
                chosen = await self._choose(batch)
                if chosen is None:
                    await self.batches.update(
                        batch.batch_id,
                        state="ended",
                        note="every job was settled before the batch was sent",
                        ended_at=datetime.now(UTC),
                    )
                    return BatchSent(empty=True)
                if not chosen:
                    return await self._unsent(batch, "ended", "no job of it can run")
                # Kept before the provider is asked: a try after this one cannot know whether
                # the provider made the batch, and looks for it before sending again.
                sending_at = datetime.now(UTC)
                await through_outages(
                    "record send",
                    lambda: self.batches.update(
                        batch.batch_id, sending_at=sending_at, lines_sent=len(chosen)
                    ),
                )
                found = await api.submit(batch.batch_id, batch.model, self._lines(chosen))
        except BatchUnsupported as err:
            return await self._unsent(batch, "unsupported", str(err))
        except AdapterError as err:
            if err.kind.is_retryable:
                raise  # Temporal asks again, by the batch workflow's retry policy
            return await self._unsent(batch, "refused", f"the provider refused the batch: {err}")
        except Exception as err:
            if not gave_up_on(err):
                raise
            why = f"sending failed {UNKNOWN_TRIES} times: {type(err).__name__}: {err}"
            return await self._unsent(batch, "refused", why[:500])
        sent_at = datetime.now(UTC)
        await through_outages(
            "record sent batch",
            lambda: self.batches.update(
                batch.batch_id, state="sent", provider_batch_id=found, sent_at=sent_at
            ),
        )
        return BatchSent(found)

    async def _choose(self, batch: ProviderBatch) -> list[str] | None:
        """The jobs the batch sends: its still-queued ones (None: it has none) that their
        adapter takes (the others run directly, where their own call says why), within the
        providers' size limit (the rest go back to be gathered into the next batch). Read a
        page of prompts at a time: only the chosen ids are held."""
        chosen: list[str] = []
        left: list[str] = []
        size, queued = 0, False
        after: Member | None = None
        caps = await self.store.spend_caps.caps()
        while page := await self.batches.with_prompts(batch.batch_id, after=after, limit=PAGE):
            after = page[-1]
            for member in page:
                if member.job.state is not JobState.QUEUED:
                    continue
                queued = True
                request = await self._request(member)
                try:
                    self.adapters.check(request)
                except InvalidOptions as err:
                    # Its own call fails it, as `provider_4xx`, saying why.
                    await self._direct(member, f"{DIRECTLY}: {err}")
                    continue
                size += request_bytes(request)
                if size > BATCH_BYTES and chosen:
                    left.append(member.job.job_id)
                    continue
                if (over := await self._hold(member, caps)) is not None:
                    # Past its cap: it runs directly, and waits for the cap there.
                    await self._direct(member, f"{DIRECTLY}: {over}")
                    continue
                chosen.append(member.job.job_id)
        if left:
            await self.batches.release(batch.batch_id, left)
        return chosen if queued else None

    async def _hold(self, member: Member, caps: Caps) -> str | None:
        """Under a spend cap, the line holds what it may cost at the batch price (the
        estimate a direct call holds, halved or as the model's `batch` says); why not, if
        that does not fit."""
        job, prompt = member.job, member.prompt
        found = caps.of(job.org, job.key_id)
        if not found or prompt is None:
            return None
        options, _ = options_of(job, prompt)
        images, answer = count_images(prompt.messages), answer_estimate(self.adapters, options)
        usd = call_cost(
            self.prices, self.adapters, prompt.text, options, images, answer, batch=True
        )
        if usd is None and self.allow_unpriced:
            usd = 0.0
        place = f"{self.adapters.provider_of(options)}/{self.adapters.model_of(options)}"
        return await self.store.spend_caps.hold_line(
            job.job_id, job.attempt + 1, job.org, job.key_id, found, usd, place
        )

    async def _lines(self, job_ids: list[str]) -> AsyncIterator[AdapterRequest]:
        """The chosen jobs' requests, read a page of prompts at a time."""
        for first in range(0, len(job_ids), PAGE):
            for member in await self.batches.prompts_of(job_ids[first : first + PAGE]):
                yield await self._request(member)

    async def _request(self, member: Member) -> AdapterRequest:
        assert member.prompt is not None
        return await adapter_request(self.store, member.job, member.prompt, member.job.attempt + 1)

    async def _sent_before(self, api: BatchAPI, batch: ProviderBatch) -> str | None:
        """The provider batch an earlier try's send made, if one began (its answer lost to a
        timeout, a 5xx, a worker's death): the provider's, found by our tag or by what it
        shows, and not one another batch of ours holds. None: none was made, send it."""
        if batch.sending_at is None:
            return None
        candidates = await api.find(batch.batch_id, batch.sending_at, batch.lines_sent or 0)
        taken = await self.batches.recorded(candidates)
        found = next((c for c in candidates if c not in taken), None)
        if found is not None:
            activity.logger.info(
                "provider batch %s: adopting %s, made by an earlier send", batch.batch_id, found
            )
        return found

    async def _unsent(self, batch: ProviderBatch, state: str, why: str) -> BatchSent:
        """The batch is not sent: its jobs run directly, saying why."""
        activity.logger.warning("provider batch %s not sent: %s", batch.batch_id, why)
        await self.batches.update(batch.batch_id, state=state, note=why, ended_at=datetime.now(UTC))
        for member in await self.batches.members(batch.batch_id):
            if member.deferred.verdict is None:
                await self._direct(member, f"{DIRECTLY}: {why}")
        return BatchSent(direct=why)

    async def _direct(self, member: Member, via: str) -> None:
        """The job runs directly, its batch not having sent it: kept and told."""
        verdict = BatchVerdict(False, member.job.state, member.job.attempt, via=via)
        # What its line held under a spend cap is given back: it was not sent.
        await self.store.spend_caps.release(member.job.job_id, member.job.attempt + 1)
        await self.batches.record(member.job.job_id, verdict=asdict(verdict))
        await self._tell(member, verdict)

    @activity.defn(name="poll_provider_batch")
    async def poll_provider_batch(self, ref: ProviderBatchRef) -> BatchPoll:
        """The provider's word on the batch. Once it runs it, its queued jobs are `running`
        (an attempt each); while it runs, if every job in it was cancelled, it is cancelled."""
        batch = await self.batches.get(ref.batch_id)
        api = self._api(batch)
        assert batch.provider_batch_id is not None, batch.batch_id
        try:
            if api is None:
                raise AdapterError(
                    ErrorKind.AUTH, f"provider {batch.provider} is no longer configured here"
                )
            status = await api.status(batch.provider_batch_id)
        except Exception as err:
            if isinstance(err, AdapterError) and err.kind.is_retryable:
                raise  # asked again, by the workflow's retry policy
            if not isinstance(err, AdapterError) and not gave_up_on(err):
                raise
            # The provider no longer has it (deleted, another key, the provider removed), or
            # cannot tell: its jobs run directly.
            activity.logger.warning("provider batch %s lost: %s", batch.batch_id, err)
            await self.batches.update(batch.batch_id, provider_status=LOST, note=str(err)[:500])
            return BatchPoll(LOST, ended=True)
        jobs = await self.batches.jobs(batch.batch_id)
        if not status.ended and jobs and all(job.state.is_terminal for job, _ in jobs):
            await api.cancel(batch.provider_batch_id)
            activity.logger.info("provider batch %s: every job cancelled", batch.batch_id)
        elif status.running:
            for job, deferred in jobs:
                if job.state is JobState.QUEUED and deferred.attempt is None:
                    await self._start(batch, job)
        if status.status != batch.provider_status:
            await self.batches.update(batch.batch_id, provider_status=status.status[:32])
        return BatchPoll(status.status, status.ended)

    async def _start(self, batch: ProviderBatch, job: Job) -> int:
        """The job's attempt in the batch begins (its row `running`): the attempt's number."""
        started = await through_outages(
            "start attempt",
            lambda: self.store.projector.start_attempt(
                job.job_id, job.attempt + 1, via_batch(batch)[:255]
            ),
        )
        attempt = started.attempt
        if started.state is JobState.RUNNING:
            await self.batches.record(job.job_id, attempt=attempt)
            await self._signal(
                job.job_id, ATTEMPT_REPORTED, AttemptReport(JobState.RUNNING, attempt)
            )
        return attempt

    @activity.defn(name="settle_provider_batch")
    async def settle_provider_batch(self, ref: ProviderBatchRef) -> BatchSettled:
        """Settle each job from its own result line (by custom_id, in any order); a job the
        provider did not run goes back to run directly. Then tell each job's workflow."""
        batch = await self.batches.get(ref.batch_id)
        api = self._api(batch)
        assert batch.provider_batch_id is not None, batch.batch_id
        members = {m.job.job_id: m for m in await self.batches.members(batch.batch_id)}
        report = BatchSettled()
        done: set[str] = set()

        async def settle(member: Member, line: LineResult) -> None:
            done.add(member.job.job_id)
            verdict = await self._verdict(batch, member, line)
            await self._tell(member, verdict)
            if verdict.settled:
                report.settled += 1
            else:
                report.direct += 1
            activity.heartbeat(len(done))

        # As the lines come: a batch's results are never held whole.
        unreadable = duplicates = 0
        try:
            if batch.provider_status != LOST and api is not None:
                async for line in api.results(batch.provider_batch_id):
                    if isinstance(line, UnreadableLine):
                        unreadable += 1
                        activity.logger.warning(
                            "provider batch %s: a result line names no job: %r",
                            batch.batch_id, line.excerpt,
                        )  # fmt: skip
                        continue
                    member = members.get(line.custom_id)
                    if member is None:
                        continue
                    if line.custom_id in done:
                        # The first copy settled the job; a second one settles nothing.
                        duplicates += 1
                        activity.logger.warning(
                            "provider batch %s: job %s's result line came again; ignored",
                            batch.batch_id, line.custom_id,
                        )  # fmt: skip
                        continue
                    await settle(member, line)
        except Exception as err:
            if isinstance(err, AdapterError) and err.kind.is_retryable:
                raise
            if not isinstance(err, AdapterError) and not gave_up_on(err):
                raise
            # Its results cannot be had: what was not settled runs directly.
            activity.logger.warning("provider batch %s: no results: %s", batch.batch_id, err)
        missing = [
            member
            for job_id, member in members.items()
            if job_id not in done and member.deferred.verdict is None
        ]
        for member in missing:
            line = LineResult(member.job.job_id)
            if unreadable >= len(missing):
                # Each line that could not be read is one of theirs: the provider ran and
                # billed it, so the job fails as a direct call's unreadable answer does
                # rather than being sent again.
                why = f"its result line in {via_batch(batch)} could not be read"
                line = replace(line, error=AdapterError(ErrorKind.PARSE, why))
            await settle(member, line)
        for job_id, member in members.items():
            if job_id not in done:
                await settle(member, LineResult(job_id))
        report.unreadable, report.duplicates = unreadable, duplicates
        await self.batches.update(
            batch.batch_id,
            state="ended",
            ended_at=datetime.now(UTC),
            unreadable_lines=unreadable,
            duplicate_lines=duplicates,
        )
        return report

    async def _verdict(
        self, batch: ProviderBatch, member: Member, line: LineResult
    ) -> BatchVerdict:
        """What the line did to the job: decided once (a repeat reads it back)."""
        if member.deferred.verdict is not None:
            return verdict_of(member.deferred.verdict)
        job = member.job
        settled = BatchLine(batch, member, line, self.settling, self.prices, self.store)
        if job.state is JobState.QUEUED and member.deferred.attempt == job.attempt:
            # Re-queued by an earlier run of this settling, which ended before it kept its
            # verdict: the job runs directly (its attempt charged, as most lines' are).
            why = f"its line in {via_batch(batch)} failed"
            verdict = BatchVerdict(False, job.state, job.attempt, via=f"{DIRECTLY}: {why}")
        elif job.state.is_terminal:
            verdict = settled_verdict(job)
            if line.result is not None or line.error is not None:
                # The tokens were spent all the same: record them (the row stays as it is).
                attempt = member.deferred.attempt or job.attempt + 1
                await self.settling.usage(await settled.usage(attempt))
        elif line.result is None and line.error is None:
            verdict = await settled.not_run()
        else:
            attempt = (
                job.attempt if job.state is JobState.RUNNING else await self._start(batch, job)
            )
            if line.result is not None:
                verdict = await settled.succeeded(attempt)
            else:
                verdict = await settled.failed(attempt)
        await self.batches.record(job.job_id, verdict=asdict(verdict))
        return verdict

    async def _tell(self, member: Member, verdict: BatchVerdict) -> None:
        await self._signal(member.job.job_id, BATCH_DONE, verdict)

    async def _signal(self, job_id: str, name: str, arg: object) -> None:
        """Signal the job's workflow; one that has ended (a cancelled job) needs nothing."""
        try:
            await activity.client().get_workflow_handle(job_id).signal(name, arg)
        except RPCError as err:
            if err.status is not RPCStatusCode.NOT_FOUND:
                raise


def verdict_of(kept: dict[str, Any]) -> BatchVerdict:
    """A verdict as DeferredJob.verdict keeps it (JSON)."""
    kind = kept.get("error_kind")
    return BatchVerdict(
        **{
            **kept,
            "state": JobState(kept["state"]),
            "error_kind": None if kind is None else ErrorKind(kind),
        }
    )
