"""Where an attempt is settled, whatever ran it (a direct call, or a provider batch's line):
what its failure leads to (the lifecycle's `next_step`), the job re-queued, failed or
succeeded through the projector with the attempt's usage record, and the usage counted in the
metrics. Every write waits out a database outage (activities/outages.py)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from activities.outages import through_outages
from projections import metrics
from projections.domain.lifecycle import (
    AttemptResult,
    BackoffPolicy,
    End,
    ErrorKind,
    FailedAttempt,
    JobState,
    Reason,
    Retry,
    next_step,
)
from projections.ids import response_id_for
from projections.projector import Applied, Transition
from projections.store import JobStore
from projections.streams import AttemptUsage, OutputBatch


@dataclass(frozen=True)
class Settling:
    """A worker's one way to settle attempts (its store, retry policy and metrics labels)."""

    store: JobStore
    backoff: BackoffPolicy
    # Org labels only where the operator turned them on (PROMPTJOBS_METRICS_ORG_LABELS).
    metrics_org_labels: bool = False

    def count(self, usage: AttemptUsage) -> None:
        """Count the attempt's tokens and cost in this process's metrics."""
        metrics.count_usage(usage, usage.org if self.metrics_org_labels else "")

    def next_step(
        self,
        kind: ErrorKind,
        message: str,
        attempt: int,
        max_attempts: int,
        *,
        retry_after_s: float | None = None,
        deadline_s: float = float("inf"),
        elsewhere: bool = False,
        reason: Reason | None = None,
        outage_streak: int = 0,
    ) -> Retry | End:
        """What a failed attempt leads to: another after a delay (at the job's next place,
        if it moves on), or the job's end."""
        return next_step(
            FailedAttempt(
                kind,
                message,
                attempt,
                max_attempts,
                retry_after_s,
                elsewhere=elsewhere,
                reason=reason,
                outage_streak=outage_streak,
            ),
            policy=self.backoff,
            now_s=time.time(),
            deadline_s=deadline_s,
            unit_random=random.random(),
        )

    async def usage(self, usage: AttemptUsage, tail: OutputBatch | None = None) -> None:
        """An attempt that ends without a transition of its own: keep its text and usage."""
        projector = self.store.projector
        await through_outages("end attempt", lambda: projector.end_attempt(tail, usage))
        self.count(usage)

    async def requeue(
        self,
        job_id: str,
        attempt: int,
        kind: ErrorKind,
        message: str,
        *,
        at: datetime | None = None,
        delay_s: float = 0.0,
        usage: AttemptUsage | None = None,
        tail: OutputBatch | None = None,
        counted: bool = True,
        fallback: int | None = None,
    ) -> datetime:
        """`running → queued`: the next attempt `at` (else `delay_s` from now); when. Its
        usage is recorded, and counted in the metrics unless `counted` is False (a batch's
        line the provider never ran consumed nothing). `fallback`: the job's place from now
        on, where it moves on."""
        next_at = at or datetime.now(UTC) + timedelta(seconds=delay_s)
        requeue = Transition(
            job_id,
            JobState.QUEUED,
            attempt,
            error_kind=kind,
            error_message=message,
            next_attempt_at=next_at,
            fallback=fallback,
        )
        projector = self.store.projector
        await through_outages("re-queue", lambda: projector.apply(requeue, tail=tail, usage=usage))
        if usage is not None and counted:
            self.count(usage)
        return next_at

    async def fail(
        self, job_id: str, kind: ErrorKind, message: str, *, usage: AttemptUsage | None = None
    ) -> Applied:
        """The job's end as `failed`."""
        failed = Transition(job_id, JobState.FAILED, error_kind=kind, error_message=message)
        projector = self.store.projector
        applied = await through_outages(
            "settle failure", lambda: projector.apply(failed, usage=usage)
        )
        if usage is not None:
            self.count(usage)
        return applied

    async def succeed(
        self,
        job_id: str,
        attempt: int,
        result: AttemptResult,
        *,
        tail: OutputBatch | None = None,
        usage: AttemptUsage | None = None,
    ) -> Applied:
        """Persist the answer and settle the job `succeeded`, if the attempt is still its
        current one (a late answer is discarded; its usage is kept all the same)."""
        projector = self.store.projector
        applied = await through_outages(
            "settle success",
            lambda: projector.succeed(
                job_id, attempt, response_id_for(job_id), result, tail=tail, usage=usage
            ),
        )
        if usage is not None:
            self.count(usage)
        return applied
