"""Deferrable jobs and the provider batches they are gathered into (issue 33).

A deferrable job's workflow records it here (`defer`) and waits. A sweep (`gather`) claims
the waiting jobs of one provider and model, up to a size or once the oldest has waited long
enough, as one `provider_batches` row in one transaction: of processes sweeping at once, one
claims each job. The batch's workflow (workflows/provider_batch.py, id = `batch_id`) sends
it, polls it and settles its jobs through the projector like any attempt."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.lifecycle import JobState
from projections.errors import NotFound
from projections.event_log import utcnow
from projections.group_commit import GroupCommit, WriteTx
from projections.models import Base, DeferredJob, Job, Prompt, ProviderBatch

BATCHES = Base.metadata.tables[ProviderBatch.__tablename__]
DEFERRED = Base.metadata.tables[DeferredJob.__tablename__]
JOBS = Base.metadata.tables[Job.__tablename__]
TERMINAL_STATES = [state for state in JobState if state.is_terminal]

# A provider found without a batch API is not asked again for this long: its deferrable
# jobs run directly at once instead of waiting to be gathered into a batch it refuses.
UNSUPPORTED_MEMORY = timedelta(hours=1)


def new_provider_batch_id() -> str:
    return f"pbatch_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Member:
    """A job of a provider batch, with its place in the batch, and its prompt where it was
    read (a batch's prompts are read a page at a time, only where they are needed)."""

    job: Job
    deferred: DeferredJob
    prompt: Prompt | None = None


class ProviderBatches:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def defer(
        self, job: Job, provider: str, model: str, *, place: int | None = None
    ) -> DeferredJob:
        """The job waits to be gathered into a batch of `provider` and `model` (once: a
        repeat of the same job's deferral changes nothing): its row as it now stands.
        `place`: that is another of the job's places (`options.fallbacks`), its place from
        now on."""
        row = {
            "job_id": job.job_id,
            "org": job.org,
            "provider": provider[:32],
            "model": model[:128],
            "deferred_at": utcnow(),
            "batch_id": None,
        }

        def write(tx: WriteTx) -> DeferredJob:
            dialect_insert = pg_insert if tx.postgresql else sqlite_insert
            tx.execute(dialect_insert(DEFERRED).on_conflict_do_nothing(), row)
            # Why it waits, on its row (as a wait for provider capacity says it); its start
            # clears it.
            waiting = f"deferrable: waiting for a provider batch of {provider}/{model}"
            values: dict[str, Any] = {"waiting_for": waiting[:1000]}
            if place is not None:
                values["fallback"] = place
            tx.execute(
                update(JOBS)
                .where(JOBS.c.job_id == job.job_id, JOBS.c.state == JobState.QUEUED)
                .values(values)
            )
            kept = tx.execute(select(DEFERRED).where(DEFERRED.c.job_id == job.job_id)).one()
            return DeferredJob(**kept._mapping)

        return await self.writes.run(write)

    async def move_on(self, job_id: str, place: int) -> None:
        """The queued job runs at its `place`-th place from now on (its batch ended without
        running it: the same rule as an outage)."""

        def write(tx: WriteTx) -> None:
            tx.execute(
                update(JOBS)
                .where(JOBS.c.job_id == job_id, JOBS.c.state == JobState.QUEUED)
                .values(fallback=place)
            )

        await self.writes.run(write)

    async def unsupported(self, provider: str) -> str | None:
        """Why `provider` has no batch API, if a batch found so lately (UNSUPPORTED_MEMORY)."""
        since = utcnow() - UNSUPPORTED_MEMORY
        stmt = (
            select(ProviderBatch.note)
            .where(
                ProviderBatch.provider == provider,
                ProviderBatch.state == "unsupported",
                ProviderBatch.created_at >= since,
            )
            .order_by(ProviderBatch.created_at.desc())
            .limit(1)
        )
        async with self.sessions() as session:
            note = (await session.execute(stmt)).scalar()
        return None if note is None else str(note)

    async def gather(self, max_jobs: int, max_wait_s: float) -> list[ProviderBatch]:
        """Claim the waiting jobs of each provider and model as batches of up to `max_jobs`,
        oldest first: a full batch at once, a smaller one once its oldest job has waited
        `max_wait_s`. Jobs settled meanwhile (cancelled) are dropped, never sent."""
        anyone = select(DeferredJob.job_id).where(DeferredJob.batch_id.is_(None)).limit(1)
        async with self.sessions() as session:
            if (await session.execute(anyone)).first() is None:
                return []  # nothing waits: no write transaction

        def write(tx: WriteTx) -> list[ProviderBatch]:
            now = utcnow()
            settled = select(JOBS.c.job_id).where(JOBS.c.state.in_(TERMINAL_STATES))
            tx.execute(
                delete(DEFERRED).where(
                    DEFERRED.c.batch_id.is_(None), DEFERRED.c.job_id.in_(settled)
                )
            )
            groups = tx.execute(
                select(DEFERRED.c.provider, DEFERRED.c.model)
                .where(DEFERRED.c.batch_id.is_(None))
                .distinct()
            ).all()
            made: list[ProviderBatch] = []
            for provider, model in groups:
                while (batch := _claim(tx, provider, model, max_jobs, max_wait_s, now)) is not None:
                    made.append(batch)
            return made

        return await self.writes.run(write)

    async def recent(self, limit: int) -> list[ProviderBatch]:
        """The newest batches first (the operator's view)."""
        stmt = (
            select(ProviderBatch)
            .order_by(ProviderBatch.created_at.desc(), ProviderBatch.batch_id.desc())
            .limit(limit)
        )
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def waiting(self) -> list[tuple[str, str, int]]:
        """(provider, model, jobs) of the deferrable jobs not yet gathered into a batch."""
        stmt = (
            select(DeferredJob.provider, DeferredJob.model, func.count())
            .join(Job, Job.job_id == DeferredJob.job_id)
            .where(DeferredJob.batch_id.is_(None), Job.state == JobState.QUEUED)
            .group_by(DeferredJob.provider, DeferredJob.model)
            .order_by(DeferredJob.provider, DeferredJob.model)
        )
        async with self.sessions() as session:
            rows = (await session.execute(stmt)).all()
        return [(str(provider), str(model), int(count)) for provider, model, count in rows]

    async def unstarted(self, older_than_s: float) -> list[ProviderBatch]:
        """Batches whose workflow was never started (the claiming process died before it
        could), claimed longer ago than `older_than_s`."""
        before = utcnow() - timedelta(seconds=older_than_s)
        stmt = select(ProviderBatch).where(
            ProviderBatch.workflow_started.is_(False), ProviderBatch.created_at < before
        )
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def unfinished(self) -> list[ProviderBatch]:
        """Batches whose workflow was started and that are not over (gathered or sent): where
        a lost workflow would be."""
        stmt = select(ProviderBatch).where(
            ProviderBatch.workflow_started.is_(True),
            ProviderBatch.state.in_(("gathered", "sent")),
        )
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def get(self, batch_id: str) -> ProviderBatch:
        async with self.sessions() as session:
            batch = await session.get(ProviderBatch, batch_id)
        if batch is None:
            raise NotFound("provider batch", batch_id)
        return batch

    async def members(self, batch_id: str) -> list[Member]:
        """The batch's jobs without their prompts, in the order they were deferred."""
        return [Member(job, deferred) for job, deferred in await self.jobs(batch_id)]

    async def with_prompts(
        self, batch_id: str, *, after: Member | None, limit: int
    ) -> list[Member]:
        """A page of the batch's jobs with their prompts, in the order they were deferred,
        after `after` (the last of the page before)."""
        stmt = (
            select(Job, Prompt, DeferredJob)
            .join(DeferredJob, DeferredJob.job_id == Job.job_id)
            .join(Prompt, Prompt.prompt_id == Job.prompt_id)
            .where(DeferredJob.batch_id == batch_id)
            .order_by(DeferredJob.deferred_at, DeferredJob.job_id)
            .limit(limit)
        )
        if after is not None:
            stmt = stmt.where(
                tuple_(DeferredJob.deferred_at, DeferredJob.job_id)
                > tuple_(after.deferred.deferred_at, after.job.job_id)
            )
        async with self.sessions() as session:
            rows = (await session.execute(stmt)).all()
        return [Member(job, deferred, prompt) for job, prompt, deferred in rows]

    async def prompts_of(self, job_ids: list[str]) -> list[Member]:
        """These jobs with their prompts, in the order given."""
        stmt = (
            select(Job, Prompt, DeferredJob)
            .join(DeferredJob, DeferredJob.job_id == Job.job_id)
            .join(Prompt, Prompt.prompt_id == Job.prompt_id)
            .where(Job.job_id.in_(job_ids))
        )
        async with self.sessions() as session:
            rows = (await session.execute(stmt)).all()
        found = {job.job_id: Member(job, deferred, prompt) for job, prompt, deferred in rows}
        return [found[job_id] for job_id in job_ids if job_id in found]

    async def jobs(self, batch_id: str) -> list[tuple[Job, DeferredJob]]:
        """The batch's jobs without their prompts (what a poll needs: a batch's prompts may
        be large, and it is polled every minute for up to a day)."""
        stmt = (
            select(Job, DeferredJob)
            .join(DeferredJob, DeferredJob.job_id == Job.job_id)
            .where(DeferredJob.batch_id == batch_id)
            .order_by(DeferredJob.deferred_at, DeferredJob.job_id)
        )
        async with self.sessions() as session:
            return [(job, deferred) for job, deferred in (await session.execute(stmt)).all()]

    async def record(self, job_id: str, **values: Any) -> None:
        """Keep what the batch did with one of its jobs (DeferredJob.attempt, .verdict)."""

        def write(tx: WriteTx) -> None:
            tx.execute(update(DEFERRED).where(DEFERRED.c.job_id == job_id).values(**values))

        await self.writes.run(write)

    async def release(self, batch_id: str, job_ids: list[str]) -> None:
        """These jobs leave the batch (before it is sent) to be gathered into another."""

        def write(tx: WriteTx) -> None:
            tx.execute(
                update(DEFERRED)
                .where(DEFERRED.c.batch_id == batch_id, DEFERRED.c.job_id.in_(job_ids))
                .values(batch_id=None)
            )
            tx.execute(
                update(BATCHES)
                .where(BATCHES.c.batch_id == batch_id)
                .values(jobs=BATCHES.c.jobs - len(job_ids))
            )

        await self.writes.run(write)

    async def recorded(self, provider_batch_ids: list[str]) -> set[str]:
        """Of these provider batch ids, those a batch of ours already holds."""
        if not provider_batch_ids:
            return set()
        async with self.sessions() as session:
            found = await session.execute(
                select(ProviderBatch.provider_batch_id).where(
                    ProviderBatch.provider_batch_id.in_(provider_batch_ids)
                )
            )
            return {str(value) for value in found.scalars()}

    async def update(self, batch_id: str, **values: Any) -> None:
        def write(tx: WriteTx) -> None:
            tx.execute(update(BATCHES).where(BATCHES.c.batch_id == batch_id).values(**values))

        await self.writes.run(write)


def _claim(
    tx: WriteTx, provider: str, model: str, max_jobs: int, max_wait_s: float, now: datetime
) -> ProviderBatch | None:
    """One batch of the oldest waiting jobs of `provider` and `model`, if it is due."""
    waiting = (
        select(DEFERRED.c.job_id, DEFERRED.c.deferred_at)
        .where(
            DEFERRED.c.batch_id.is_(None),
            DEFERRED.c.provider == provider,
            DEFERRED.c.model == model,
        )
        .order_by(DEFERRED.c.deferred_at, DEFERRED.c.job_id)
        .limit(max_jobs)
    )
    if tx.postgresql:
        waiting = waiting.with_for_update(skip_locked=True)
    rows = tx.execute(waiting).all()
    if not rows:
        return None
    if len(rows) < max_jobs and rows[0].deferred_at > now - timedelta(seconds=max_wait_s):
        return None
    batch = ProviderBatch(
        batch_id=new_provider_batch_id(),
        provider=provider,
        model=model,
        state="gathered",
        jobs=len(rows),
        workflow_started=False,
        unreadable_lines=0,
        duplicate_lines=0,
        created_at=now,
    )
    values = {column.name: getattr(batch, column.name, None) for column in BATCHES.columns}
    tx.execute(insert(BATCHES), values)
    ids = [row.job_id for row in rows]
    tx.execute(
        update(DEFERRED)
        .where(DEFERRED.c.job_id.in_(ids), DEFERRED.c.batch_id.is_(None))
        .values(batch_id=batch.batch_id)
    )
    return batch
