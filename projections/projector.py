"""The idempotent projector: applies job transitions to the job rows and appends job events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections import metrics
from projections.db import GroupCommit
from projections.models import Job, JobEvent, Response
from projections.notifications import notify_event
from projections.states import JobState, is_allowed, progress_rank

STATE_CHANGED = "job.state_changed"


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Transition:
    """One change a job asks for. `attempt` None means "whatever attempt the row is at"."""

    job_id: str
    target: JobState
    attempt: int | None = None
    error_kind: str | None = None
    error_message: str | None = None
    next_attempt_at: datetime | None = None
    worker: str | None = None
    response_id: str | None = None
    superseded_by: str | None = None
    # A succeeded transition is only valid for the attempt that produced the result.
    require_current_attempt: bool = False


@dataclass
class ResponseRecord:
    text: str
    provider: str
    model: str
    provider_request_id: str | None = None
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_ms: int | None = None


@dataclass
class Applied:
    """What the projector did: whether the transition took, and the row as it now stands."""

    applied: bool
    state: JobState
    attempt: int
    event_ids: list[int] = field(default_factory=list)
    error_kind: str | None = None
    error_message: str | None = None


def job_row(job: Job) -> dict[str, Any]:
    """The job row as clients see it (shared/DESIGN.md's fields, UTC ISO-8601)."""

    def iso(value: datetime | None) -> str | None:
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None

    return {
        "job_id": job.job_id,
        "prompt_id": job.prompt_id,
        "state": job.state.value,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "error_kind": job.error_kind,
        "error_message": job.error_message,
        "next_attempt_at": iso(job.next_attempt_at),
        "response_id": job.response_id,
        "supersedes": job.supersedes,
        "superseded_by": job.superseded_by,
        "scheduled_for": iso(job.scheduled_for),
        "created_at": iso(job.created_at),
        "updated_at": iso(job.updated_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
    }


async def lock_event_log(session: AsyncSession) -> None:
    """Serialise appends to job_events so ids commit in order: a cursor never skips an event.

    SQLite already serialises writers (BEGIN IMMEDIATE). On PostgreSQL a sequence value taken
    by one transaction can commit after a larger one; a transaction-scoped advisory lock makes
    allocation and commit order the same.
    """
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(text("SELECT pg_advisory_xact_lock(7215001)"))


async def load_for_update(session: AsyncSession, job_id: str) -> Job | None:
    await lock_event_log(session)
    return (
        await session.execute(select(Job).where(Job.job_id == job_id).with_for_update())
    ).scalar_one_or_none()


async def append_event(session: AsyncSession, job: Job, now: datetime) -> int:
    job.updated_at = now
    await session.flush()
    event = JobEvent(
        type=STATE_CHANGED,
        job_id=job.job_id,
        prompt_id=job.prompt_id,
        org=job.org,
        author=job.author,
        state=job.state,
        data=job_row(job),
        created_at=now,
    )
    session.add(event)
    await session.flush()
    job.last_event_id = event.id
    metrics.transition_pending(session, job)
    # Sent at commit, to API processes that wake their SSE streams on it (PostgreSQL only).
    await notify_event(session, event.id)
    return event.id


def _accepts(job: Job, t: Transition) -> bool:
    if not is_allowed(job.state, t.target, t.error_kind):
        return False
    if t.require_current_attempt and t.attempt != job.attempt:
        return False
    if t.target.is_terminal:
        return True
    attempt = job.attempt if t.attempt is None else t.attempt
    return progress_rank(t.target, attempt) > job.progress_rank


def _apply(job: Job, t: Transition, now: datetime) -> None:
    job.state = t.target
    if t.attempt is not None:
        job.attempt = t.attempt
    if not t.target.is_terminal:
        job.progress_rank = progress_rank(t.target, job.attempt)
    if t.target is JobState.RUNNING:
        job.worker = t.worker
        job.next_attempt_at = None
        job.started_at = job.started_at or now
    elif t.target is JobState.QUEUED:
        job.next_attempt_at = t.next_attempt_at
    if t.error_kind is not None:
        job.error_kind = t.error_kind
        job.error_message = t.error_message
    if t.target is JobState.SUCCEEDED:
        job.response_id = t.response_id
        job.error_kind = None
        job.error_message = None
    if t.target is JobState.SUPERSEDED:
        job.superseded_by = t.superseded_by
    elif t.target.is_terminal:
        job.next_attempt_at = None
        job.finished_at = now


class Projector:
    """The one writer of job state. Every method is one transaction and safe to repeat."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.on_commit = on_commit
        # Shared by every writer in this process (the job store's submits too).
        self.writes = GroupCommit(sessions)

    def _committed(self, result: Applied) -> Applied:
        if result.event_ids and self.on_commit is not None:
            self.on_commit()
        return result

    async def apply(self, t: Transition) -> Applied:
        async def write(session: AsyncSession) -> Applied:
            job = await load_for_update(session, t.job_id)
            if job is None:
                raise LookupError(f"no job {t.job_id}")
            return await apply_in(session, job, t)

        return self._committed(await self.writes.run(write))

    async def start_attempt(self, job_id: str, attempt: int, worker: str) -> Applied:
        """Attempt `attempt` begins. If the row still shows an earlier attempt running, that
        attempt's worker died without reporting (heartbeat timeout): record it as
        worker_crash before starting this one."""

        async def write(session: AsyncSession) -> Applied:
            job = await load_for_update(session, job_id)
            now = utcnow()  # under the lock: timestamps follow event order
            if job is None:
                raise LookupError(f"no job {job_id}")
            events: list[int] = []
            if job.state is JobState.RUNNING and job.attempt < attempt:
                crashed = Transition(
                    job_id,
                    JobState.QUEUED,
                    attempt=job.attempt,
                    error_kind="worker_crash",
                    error_message=(
                        f"attempt {job.attempt} lost its worker ({job.worker or 'unknown'}): "
                        "no heartbeat"
                    ),
                    next_attempt_at=now,
                )
                events += (await apply_in(session, job, crashed, now)).event_ids
            result = await apply_in(
                session, job, Transition(job_id, JobState.RUNNING, attempt, worker=worker), now
            )
            result.event_ids = events + result.event_ids
            return result

        return self._committed(await self.writes.run(write))

    async def succeed(
        self, job_id: str, attempt: int, response_id: str, response: ResponseRecord
    ) -> Applied:
        """Persist the response and settle the job, only if this attempt is still the job's.
        A response for a cancelled job, or from an attempt presumed dead, is discarded."""

        async def write(session: AsyncSession) -> Applied:
            job = await load_for_update(session, job_id)
            now = utcnow()  # under the lock: timestamps follow event order
            if job is None:
                raise LookupError(f"no job {job_id}")
            if job.state is JobState.SUCCEEDED and job.response_id == response_id:
                return Applied(False, job.state, job.attempt)
            t = Transition(
                job_id,
                JobState.SUCCEEDED,
                attempt,
                response_id=response_id,
                require_current_attempt=True,
            )
            if not _accepts(job, t):
                return Applied(False, job.state, job.attempt)
            existing = await session.get(Response, response_id)
            if existing is None:
                session.add(
                    Response(
                        response_id=response_id,
                        job_id=job.job_id,
                        prompt_id=job.prompt_id,
                        org=job.org,
                        author=job.author,
                        attempt=attempt,
                        created_at=now,
                        **response.__dict__,
                    )
                )
            return await apply_in(session, job, t, now)

        return self._committed(await self.writes.run(write))


async def apply_in(
    session: AsyncSession, job: Job, t: Transition, now: datetime | None = None
) -> Applied:
    """Apply `t` to a row already locked in `session`; the caller's transaction commits it."""
    now = now or utcnow()
    if not _accepts(job, t):
        return Applied(False, job.state, job.attempt, [], job.error_kind, job.error_message)
    _apply(job, t, now)
    event_id = await append_event(session, job, now)
    return Applied(True, job.state, job.attempt, [event_id], job.error_kind, job.error_message)
