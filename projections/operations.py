"""The operator's reads and housekeeping across every org: listings, queue metrics, worker
health and archiving. Only the CLI on the service's own database calls these; no API key
reaches them (API keys are member or admin of one org)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, case, delete, func, not_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.lifecycle import TERMINAL, ErrorKind, JobState
from projections.group_commit import GroupCommit, WriteTx
from projections.models import (
    AttemptRecord,
    Batch,
    BatchLine,
    DeferredJob,
    FileChunk,
    Job,
    JobEvent,
    JobOutput,
    Prompt,
    PromptParent,
    ProviderBatch,
    Response,
    StoredFile,
    WebhookDelivery,
)
from projections.openai_batches import ACTIVE
from projections.projector import exclude_writers_of_prompts
from projections.webhooks import PENDING

PERCENTILES = (50, 90, 99)


def percentiles(values: list[float]) -> dict[str, float | None]:
    """The mean (the seed's "average latency"), then nearest-rank percentiles, so each
    percentile is a latency some job really had."""
    ordered = sorted(values)
    result: dict[str, float | None] = {
        "mean": round(sum(ordered) / len(ordered), 3) if ordered else None
    }
    for p in PERCENTILES:
        if not ordered:
            result[f"p{p}"] = None
            continue
        rank = max(1, -(-p * len(ordered) // 100))  # ceil(p/100 · n)
        result[f"p{p}"] = round(ordered[rank - 1], 3)
    return result


@dataclass
class OrgMetrics:
    org: str
    states: dict[str, int] = field(default_factory=dict)
    wait_s: dict[str, float | None] = field(default_factory=dict)  # created → started
    run_s: dict[str, float | None] = field(default_factory=dict)  # started → finished
    error_kinds: dict[str, int] = field(default_factory=dict)
    # failed / (succeeded + failed + cancelled); a superseded job counts through its retry.
    error_rate: float | None = None


@dataclass
class UsageMetrics:
    """What one org's attempts on one model consumed (model "*": the org's total)."""

    org: str
    provider: str
    model: str
    attempts: int
    input_tokens: int
    output_tokens: int
    # Of the attempts with a price; `unpriced` attempts ran on a model without one.
    cost_usd: float
    unpriced: int
    # Attempts whose counts are ours (estimated), not the provider's.
    estimated: int


def error_rate(states: Counter[str]) -> float | None:
    """Of the jobs that came to an outcome that stands, the share that failed."""
    outcomes = [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]
    settled = sum(states.get(state.value, 0) for state in outcomes)
    return round(states.get(JobState.FAILED.value, 0) / settled, 4) if settled else None


@dataclass
class WorkerSeen:
    worker: str
    last_seen: datetime
    running: int
    succeeded: int
    failed: int
    cancelled: int


@dataclass
class ProjectionHealth:
    states: dict[str, int]
    last_transition_at: datetime | None
    workers: list[WorkerSeen]


@dataclass
class Archived:
    jobs: int
    events: int
    prompts: int
    responses: int
    dry_run: bool


@dataclass(frozen=True)
class StorageArchived:
    files: int
    batches: int
    provider_batches: int
    webhook_deliveries: int = 0


def _count(tx: WriteTx, rows: Select[Any]) -> int:
    counted = select(func.count()).select_from(rows.subquery())
    return int(tx.execute(counted).scalar() or 0)


class Operations:
    """What an operator reads and does across orgs (`JobStore.operations`)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def spared_calls(self, job_ids: list[str]) -> dict[str, int]:
        """Of these jobs, the calls a 429 refused (each spent no attempt), where any did."""
        if not job_ids:
            return {}
        async with self.sessions() as session:
            rows = await session.execute(
                select(AttemptRecord.job_id, func.count())
                .where(
                    AttemptRecord.job_id.in_(job_ids),
                    AttemptRecord.outcome == ErrorKind.RATE_LIMIT.value,
                )
                .group_by(AttemptRecord.job_id)
            )
            return {job_id: int(n) for job_id, n in rows.all()}

    async def list_jobs(
        self,
        *,
        state: JobState | None = None,
        org: str | None = None,
        since: datetime | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Newest first: jobs created at or after `since`, of every org unless one is named."""
        stmt = select(Job)
        if state is not None:
            stmt = stmt.where(Job.state == state)
        if org is not None:
            stmt = stmt.where(Job.org == org)
        if since is not None:
            stmt = stmt.where(Job.created_at >= since)
        stmt = stmt.order_by(Job.created_at.desc(), Job.job_id.desc()).limit(limit)
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def queue_metrics(
        self,
        *,
        since: datetime | None = None,
        org: str | None = None,
    ) -> list[OrgMetrics]:
        """Per org (and "*" for all): jobs by state, wait and run latency (mean and percentiles),
        the error rate, and the error kinds of the attempts that ended in an error (retried or
        not; and of jobs that failed without an attempt's record: a dead worker, the ceiling)."""
        stmt = select(
            Job.org, Job.state, Job.error_kind, Job.created_at, Job.started_at, Job.finished_at
        )
        if since is not None:
            stmt = stmt.where(Job.created_at >= since)
        if org is not None:
            stmt = stmt.where(Job.org == org)
        # Each attempt that ended in an error counts, retried or not: a re-queue's kind is
        # cleared from the row by the success that follows it, but not from the attempts.
        errors = (
            select(AttemptRecord.org, AttemptRecord.outcome, func.count())
            .where(AttemptRecord.outcome.in_([kind.value for kind in ErrorKind]))
            .group_by(AttemptRecord.org, AttemptRecord.outcome)
        )
        if since is not None:
            errors = errors.where(AttemptRecord.started_at >= since)
        if org is not None:
            errors = errors.where(AttemptRecord.org == org)
        async with self.sessions() as session:
            rows = (await session.execute(stmt)).all()
            attempt_errors = (await session.execute(errors)).all()
        kinds_of: dict[str, Counter[str]] = defaultdict(Counter)
        for row_org, outcome, count in attempt_errors:
            kinds_of[row_org][outcome] += count
            kinds_of["*"][outcome] += count
        groups: dict[
            str, list[tuple[JobState, str | None, datetime, datetime | None, datetime | None]]
        ]
        groups = defaultdict(list)
        for row_org, state, kind, created, started, finished in rows:
            groups[row_org].append((state, kind, created, started, finished))
            groups["*"].append((state, kind, created, started, finished))
        result = []
        for name in sorted(groups, key=lambda g: (g == "*", g)):
            jobs = groups[name]
            states = Counter(state.value for state, *_ in jobs)
            # Ends no attempt records: a job whose worker died, or that passed its ceiling.
            unrecorded = (ErrorKind.WORKER_CRASH, ErrorKind.STUCK)
            kinds = kinds_of[name] + Counter(
                kind for state, kind, *_ in jobs if state is JobState.FAILED and kind in unrecorded
            )
            waits = [(s - c).total_seconds() for _, _, c, s, _ in jobs if s is not None]
            runs = [(f - s).total_seconds() for _, _, _, s, f in jobs if s and f]
            result.append(
                OrgMetrics(
                    org=name,
                    states={state.value: states.get(state.value, 0) for state in JobState},
                    wait_s=percentiles(waits),
                    run_s=percentiles(runs),
                    error_kinds=dict(sorted(kinds.items())),
                    error_rate=error_rate(states),
                )
            )
        return result

    async def usage_metrics(
        self,
        *,
        since: datetime | None = None,
        org: str | None = None,
    ) -> list[UsageMetrics]:
        """Tokens and cost of the attempts that ended at or after `since`, per org and model,
        each org followed by its total."""
        stmt = select(
            AttemptRecord.org,
            AttemptRecord.provider,
            AttemptRecord.model,
            func.count(),
            func.coalesce(func.sum(AttemptRecord.input_tokens), 0),
            func.coalesce(func.sum(AttemptRecord.output_tokens), 0),
            func.coalesce(func.sum(AttemptRecord.cost_usd), 0.0),
            func.count() - func.count(AttemptRecord.cost_usd),
            func.sum(case((AttemptRecord.usage_estimated, 1), else_=0)),
        ).group_by(AttemptRecord.org, AttemptRecord.provider, AttemptRecord.model)
        if since is not None:
            stmt = stmt.where(AttemptRecord.ended_at >= since)
        if org is not None:
            stmt = stmt.where(AttemptRecord.org == org)
        async with self.sessions() as session:
            rows = (
                await session.execute(
                    stmt.order_by(AttemptRecord.org, AttemptRecord.provider, AttemptRecord.model)
                )
            ).all()
        result: list[UsageMetrics] = []
        for name in sorted({row[0] for row in rows}):
            mine = [
                UsageMetrics(o, p, m, n, int(i), int(out), round(float(c), 9), int(u), int(e or 0))
                for o, p, m, n, i, out, c, u, e in rows
                if o == name
            ]
            result.extend(mine)
            result.append(
                UsageMetrics(
                    name,
                    "*",
                    "*",
                    sum(u.attempts for u in mine),
                    sum(u.input_tokens for u in mine),
                    sum(u.output_tokens for u in mine),
                    round(sum(u.cost_usd for u in mine), 9),
                    sum(u.unpriced for u in mine),
                    sum(u.estimated for u in mine),
                )
            )
        return result

    async def jobs_by_state(self) -> dict[JobState, int]:
        async with self.sessions() as session:
            counted = await session.execute(select(Job.state, func.count()).group_by(Job.state))
            found = {state: count for state, count in counted.all()}
        return {state: found.get(state, 0) for state in JobState}

    async def projection_health(self, *, workers_since: datetime) -> ProjectionHealth:
        """What the projection says about the fleet: jobs per state, the newest transition, and
        each worker (jobs.worker, recorded when an attempt starts) seen since `workers_since`."""
        by_state = await self.jobs_by_state()
        async with self.sessions() as session:
            last = (await session.execute(select(func.max(JobEvent.created_at)))).scalar()
            rows = (
                await session.execute(
                    select(Job.worker, Job.state, func.count(), func.max(Job.updated_at))
                    .where(Job.worker.is_not(None), Job.updated_at >= workers_since)
                    .group_by(Job.worker, Job.state)
                )
            ).all()
            seen: dict[str, WorkerSeen] = {}
            for worker, state, count, updated in rows:
                assert worker is not None
                entry = seen.setdefault(worker, WorkerSeen(worker, updated, 0, 0, 0, 0))
                entry.last_seen = max(entry.last_seen, updated)
                if state is JobState.RUNNING:
                    entry.running += count
                elif state is JobState.SUCCEEDED:
                    entry.succeeded += count
                elif state is JobState.FAILED:
                    entry.failed += count
                elif state is JobState.CANCELLED:
                    entry.cancelled += count
        return ProjectionHealth(
            states={state.value: count for state, count in by_state.items()},
            last_transition_at=last,
            workers=sorted(seen.values(), key=lambda w: w.last_seen, reverse=True),
        )

    async def archive(
        self,
        *,
        before: datetime,
        dry_run: bool = False,
        batch: int | None = None,
    ) -> Archived:
        """Remove terminal jobs finished before `before` with their events, their streamed
        output and their attempt records; a prompt left with no job goes too, with its
        responses. One transaction that excludes user retries, so a concurrent retry cannot add
        a job to a prompt being removed.

        `batch`: remove at most that many jobs (the longest finished first), so that one
        transaction holds the write lock briefly; the scheduled retention calls this until a
        batch comes back short."""
        old = and_(Job.state.in_(TERMINAL), Job.finished_at.is_not(None), Job.finished_at < before)

        def write(tx: WriteTx) -> Archived:
            exclude_writers_of_prompts(tx)
            if batch is None:
                chosen: Any = old
            else:
                oldest = select(Job.job_id).where(old).order_by(Job.finished_at, Job.job_id)
                ids = list(tx.execute(oldest.limit(batch)).scalars())
                chosen = Job.job_id.in_(ids)
            old_jobs = select(Job.job_id).where(chosen)
            kept_prompts = select(Job.prompt_id).where(not_(chosen))
            gone_prompts = select(Job.prompt_id).where(chosen, Job.prompt_id.not_in(kept_prompts))
            counts = Archived(
                jobs=_count(tx, old_jobs),
                events=_count(tx, select(JobEvent.id).where(JobEvent.job_id.in_(old_jobs))),
                prompts=_count(tx, gone_prompts.distinct()),
                responses=_count(
                    tx,
                    select(Response.response_id).where(Response.prompt_id.in_(gone_prompts)),
                ),
                dry_run=dry_run,
            )
            if not dry_run:
                tx.execute(delete(Response).where(Response.prompt_id.in_(gone_prompts)))
                tx.execute(delete(JobEvent).where(JobEvent.job_id.in_(old_jobs)))
                tx.execute(delete(JobOutput).where(JobOutput.job_id.in_(old_jobs)))
                tx.execute(delete(AttemptRecord).where(AttemptRecord.job_id.in_(old_jobs)))
                tx.execute(delete(DeferredJob).where(DeferredJob.job_id.in_(old_jobs)))
                tx.execute(delete(Job).where(chosen))
                orphan = ~select(Job.job_id).where(Job.prompt_id == Prompt.prompt_id).exists()
                orphans = select(Prompt.prompt_id).where(orphan)
                # A chain's edges to or from a removed prompt go with it; a child's `after` keeps
                # the id, which no longer resolves (as `supersedes` does).
                tx.execute(
                    delete(PromptParent).where(
                        PromptParent.prompt_id.in_(orphans) | PromptParent.parent_id.in_(orphans)
                    )
                )
                tx.execute(delete(Prompt).where(orphan))
            return counts

        return await self.writes.run(write)

    async def archive_storage(self, *, before: datetime) -> StorageArchived:
        """Remove what the OpenAI routes, provider batches and webhooks keep, made before
        `before`: `/v1/batches` that are over, with their lines (their jobs go by `archive`,
        their output and error files with the files); files, except the input of a batch not
        yet over; provider batches that are over and hold no job any more; and webhook
        deliveries delivered or given up."""

        def write(tx: WriteTx) -> StorageArchived:
            old_batches = select(Batch.batch_id).where(
                Batch.status.not_in(ACTIVE), Batch.created_at < before
            )
            batches = _count(tx, old_batches)
            tx.execute(delete(BatchLine).where(BatchLine.batch_id.in_(old_batches)))
            tx.execute(delete(Batch).where(Batch.batch_id.in_(old_batches)))
            in_use = select(Batch.input_file_id).where(Batch.status.in_(ACTIVE))
            old_files = select(StoredFile.file_id).where(
                StoredFile.created_at < before, StoredFile.file_id.not_in(in_use)
            )
            files = _count(tx, old_files)
            tx.execute(delete(FileChunk).where(FileChunk.file_id.in_(old_files)))
            tx.execute(delete(StoredFile).where(StoredFile.file_id.in_(old_files)))
            holding = select(DeferredJob.job_id).where(
                DeferredJob.batch_id == ProviderBatch.batch_id
            )
            old_provider = and_(
                ProviderBatch.ended_at.is_not(None),
                ProviderBatch.created_at < before,
                ~holding.exists(),
            )
            provider_batches = _count(tx, select(ProviderBatch.batch_id).where(old_provider))
            tx.execute(delete(ProviderBatch).where(old_provider))
            # Deliveries made or given up (a pending one's workflow still needs its row).
            old_deliveries = and_(
                WebhookDelivery.state != PENDING, WebhookDelivery.created_at < before
            )
            deliveries = _count(tx, select(WebhookDelivery.delivery_id).where(old_deliveries))
            tx.execute(delete(WebhookDelivery).where(old_deliveries))
            return StorageArchived(files, batches, provider_batches, deliveries)

        return await self.writes.run(write)

    async def archive_in_batches(
        self,
        *,
        before: datetime,
        batch: int,
        progress: Callable[[Archived], None] | None = None,
    ) -> Archived:
        """`archive` a batch per transaction until a batch comes back short: each transaction
        holds the write lock (SQLite) or the visible horizon (PostgreSQL: SSE and `?since=` wait
        for the oldest transaction in flight) only briefly. `progress` hears the totals after
        each batch. Interrupted, it has removed whole batches; run again, it goes on."""
        total = Archived(0, 0, 0, 0, dry_run=False)
        while True:
            done = await self.archive(before=before, batch=batch)
            total = Archived(
                total.jobs + done.jobs,
                total.events + done.events,
                total.prompts + done.prompts,
                total.responses + done.responses,
                dry_run=False,
            )
            if progress is not None:
                progress(total)
            if done.jobs < batch:
                return total
