"""What the API and CLI ask of the projection: accept submissions, user retries, scoped reads."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.db import transaction
from projections.ids import new_job_id, new_prompt_id
from projections.models import Job, JobEvent, Prompt, Response
from projections.projector import (
    Projector,
    Transition,
    append_event,
    apply_in,
    load_for_update,
    lock_event_log,
    utcnow,
)
from projections.states import JobState

OPERATOR_ROLE = "operator"


@dataclass(frozen=True)
class Scope:
    """Who is asking. Admins see their whole org; members only what they authored; the
    operator (the CLI on the service's own database, never an API key) sees every org."""

    org: str
    user: str
    role: str = "member"

    @classmethod
    def operator(cls, user: str = "operator") -> Scope:
        return cls("*", user, OPERATOR_ROLE)

    @property
    def all_orgs(self) -> bool:
        return self.role == OPERATOR_ROLE

    @property
    def author(self) -> str | None:
        return None if self.role in ("admin", OPERATOR_ROLE) else self.user


@dataclass(frozen=True)
class Submission:
    text: str
    priority: int
    max_attempts: int
    options: dict[str, Any]
    scheduled_for: datetime | None = None
    idempotency_key: str | None = None
    parent_id: str | None = None
    correlation_id: str | None = None

    def fingerprint(self) -> str:
        body = {
            "text": self.text,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "options": self.options,
            "scheduled_for": self.scheduled_for.isoformat() if self.scheduled_for else None,
            "parent_id": self.parent_id,
            "correlation_id": self.correlation_id,
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class IdempotencyConflict(Exception):
    """The same Idempotency-Key was used before with a different request body."""


class NotFound(LookupError):
    pass


class InvalidState(Exception):
    """The job is not in a state that allows the action (cancel a settled job, retry a live one)."""

    def __init__(self, job: Job, action: str) -> None:
        # Values, not the row: the transaction that raised this rolls back and expires it.
        self.job_id = job.job_id
        self.state = job.state
        self.action = action
        super().__init__(f"job {job.job_id} is {job.state.value}; cannot {action} it")


@dataclass
class Accepted:
    prompt: Prompt
    job: Job
    created: bool  # False when an Idempotency-Key replay returned the original


@dataclass
class Page:
    """One page of `jobs_changed_since`: the jobs, and the cursor to pass next."""

    jobs: list[Job]
    next_cursor: int


# Ids we issue are short and plain; anything else cannot name a row, and asking the database
# about it (PostgreSQL rejects NUL in text) would only turn a 404 into a 500.
_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _plausible(ident: str) -> bool:
    return _ID_SHAPE.fullmatch(ident) is not None


def _scoped(stmt: Select[Any], model: Any, scope: Scope) -> Select[Any]:
    if scope.all_orgs:
        return stmt
    stmt = stmt.where(model.org == scope.org)
    if scope.author is not None:
        stmt = stmt.where(model.author == scope.author)
    return stmt


class JobStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], projector: Projector) -> None:
        self.sessions = sessions
        self.projector = projector

    # -- writes -------------------------------------------------------------------------

    async def submit(self, scope: Scope, submission: Submission) -> Accepted:
        """Commit the prompt and its queued job: this commit is the acceptance."""
        fingerprint = submission.fingerprint()
        if submission.idempotency_key is not None:
            replay = await self._idempotent_replay(scope, submission.idempotency_key, fingerprint)
            if replay is not None:
                return replay

        async def write(session: AsyncSession) -> Accepted:
            await lock_event_log(session)
            now = utcnow()  # under the lock: timestamps follow event order
            prompt = Prompt(
                prompt_id=new_prompt_id(),
                org=scope.org,
                author=scope.user,
                text=submission.text,
                options=submission.options,
                parent_id=submission.parent_id,
                correlation_id=submission.correlation_id,
                idempotency_key=submission.idempotency_key,
                request_hash=fingerprint,
                created_at=now,
            )
            session.add(prompt)
            await session.flush()
            job = self._new_job(prompt, submission.priority, submission.max_attempts, now)
            job.scheduled_for = submission.scheduled_for
            session.add(job)
            await append_event(session, job, now)
            return Accepted(prompt, job, created=True)

        try:
            # Concurrent submits share a transaction (GroupCommit); each returns after its commit.
            accepted = await self.projector.writes.run(write)
        except IntegrityError:
            # A concurrent request with the same Idempotency-Key won the race.
            if submission.idempotency_key is None:
                raise
            replay = await self._idempotent_replay(scope, submission.idempotency_key, fingerprint)
            if replay is None:
                raise
            return replay
        self._notify()
        return accepted

    async def _idempotent_replay(self, scope: Scope, key: str, fingerprint: str) -> Accepted | None:
        async with self.sessions() as session:
            prompt = (
                await session.execute(
                    select(Prompt).where(
                        Prompt.org == scope.org,
                        Prompt.author == scope.user,
                        Prompt.idempotency_key == key,
                    )
                )
            ).scalar_one_or_none()
            if prompt is None:
                return None
            if prompt.request_hash != fingerprint:
                raise IdempotencyConflict(key)
            job = (
                await session.execute(
                    select(Job)
                    .where(Job.prompt_id == prompt.prompt_id, Job.supersedes.is_(None))
                    .limit(1)
                )
            ).scalar_one()
            return Accepted(prompt, job, created=False)

    @staticmethod
    def _new_job(prompt: Prompt, priority: int, max_attempts: int, now: datetime) -> Job:
        return Job(
            job_id=new_job_id(),
            prompt_id=prompt.prompt_id,
            org=prompt.org,
            author=prompt.author,
            state=JobState.QUEUED,
            priority=priority,
            attempt=0,
            max_attempts=max_attempts,
            progress_rank=1,
            created_at=now,
            updated_at=now,
        )

    async def retry(self, scope: Scope, job_id: str) -> Job:
        """A user retry: a new queued job for the same prompt that supersedes `job_id`."""
        if not _plausible(job_id):
            raise NotFound(job_id)
        async with transaction(self.sessions) as session:
            old = await load_for_update(session, job_id)
            now = utcnow()  # under the lock: timestamps follow event order
            if old is None or not _visible(old, scope):
                raise NotFound(job_id)
            if not old.state.is_retryable_by_user():
                raise InvalidState(old, "retry")
            prompt = await session.get(Prompt, old.prompt_id)
            assert prompt is not None
            new = self._new_job(prompt, old.priority, old.max_attempts, now)
            new.supersedes = old.job_id
            session.add(new)
            await append_event(session, new, now)
            superseded = Transition(old.job_id, JobState.SUPERSEDED, superseded_by=new.job_id)
            result = await apply_in(session, old, superseded, now)
            if not result.applied:
                raise InvalidState(old, "retry")
        self._notify()
        return new

    async def request_cancel(self, scope: Scope, job_id: str) -> tuple[Job, bool]:
        """Record a cancel request. A queued job with no workflow start recorded is cancelled
        here and now (no attempt can be running); otherwise the workflow decides, and the
        flag says so."""
        if not _plausible(job_id):
            raise NotFound(job_id)
        async with transaction(self.sessions) as session:
            job = await load_for_update(session, job_id)
            now = utcnow()  # under the lock: timestamps follow event order
            if job is None or not _visible(job, scope):
                raise NotFound(job_id)
            if not job.state.is_cancelable():
                raise InvalidState(job, "cancel")
            job.cancel_requested_at = job.cancel_requested_at or now
            # Queued with no start recorded: no attempt is in flight, and any attempt a start
            # still on its way runs will find the job closed and not call the provider; the
            # dispatcher delivers the cancel to that workflow once it records the start
            # (mark_dispatched). A running job has a workflow, recorded or not: it decides.
            if job.dispatched_at is None and job.state is JobState.QUEUED:
                await apply_in(session, job, Transition(job_id, JobState.CANCELLED), now)
                needs_workflow = False
            else:
                needs_workflow = True
        self._notify()
        return job, needs_workflow

    async def mark_dispatched(self, job_id: str) -> bool:
        """Note that the job's workflow is started; True if a cancel was requested meanwhile,
        which the caller must now deliver to the workflow. A burst of starts shares
        transactions (GroupCommit) with each other and with the submits."""

        async def write(session: AsyncSession) -> bool:
            await session.execute(
                update(Job)
                .where(Job.job_id == job_id, Job.dispatched_at.is_(None))
                .values(dispatched_at=utcnow())
            )
            requested = await session.execute(
                select(Job.cancel_requested_at).where(Job.job_id == job_id)
            )
            return requested.scalar_one_or_none() is not None

        return await self.projector.writes.run(write)

    async def cancel_delivered(self, job_id: str) -> None:
        async with transaction(self.sessions) as session:
            await session.execute(
                update(Job).where(Job.job_id == job_id).values(cancel_requested_at=None)
            )

    def _notify(self) -> None:
        if self.projector.on_commit is not None:
            self.projector.on_commit()

    # -- reads --------------------------------------------------------------------------

    async def job(self, scope: Scope, job_id: str) -> Job:
        if not _plausible(job_id):
            raise NotFound(job_id)
        async with self.sessions() as session:
            job = await session.get(Job, job_id)
        if job is None or not _visible(job, scope):
            raise NotFound(job_id)
        return job

    async def jobs_changed_since(
        self, scope: Scope, since: int, limit: int, state: JobState | None = None
    ) -> Page:
        """The caller's jobs whose last change is after `since`, in change order.

        The log's newest id is read first. Event ids commit in order (see `lock_event_log`),
        so the query that follows sees every change up to that id; a page shorter than
        `limit` therefore holds every job changed after `since`, and the cursor may move to
        that id (or the page's last change, if later) even when no job of the caller's
        changed or none matched `state`. An empty page means: caught up."""
        async with self.sessions() as session:
            newest = await self._newest_event_id(session)
            stmt = changed_since_query(scope, since, limit, state)
            jobs = list((await session.execute(stmt)).scalars())
        if len(jobs) == limit:
            return Page(jobs, jobs[-1].last_event_id)
        return Page(jobs, max(since, newest, *(job.last_event_id for job in jobs)))

    async def events_since(
        self,
        scope: Scope,
        since: int,
        limit: int,
        job_id: str | None = None,
        prompt_id: str | None = None,
    ) -> list[JobEvent]:
        stmt = events_query(scope, since, limit, job_id, prompt_id)
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def job_events(self, scope: Scope, job_id: str) -> list[JobEvent]:
        await self.job(scope, job_id)
        async with self.sessions() as session:
            stmt = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            return list((await session.execute(stmt)).scalars())

    async def latest_event_id(self) -> int:
        async with self.sessions() as session:
            return await self._newest_event_id(session)

    @staticmethod
    async def _newest_event_id(session: AsyncSession) -> int:
        return int((await session.execute(select(func.max(JobEvent.id)))).scalar() or 0)

    async def prompt(self, scope: Scope, prompt_id: str) -> tuple[Prompt, list[Job]]:
        if not _plausible(prompt_id):
            raise NotFound(prompt_id)
        async with self.sessions() as session:
            prompt = await session.get(Prompt, prompt_id)
            if prompt is None or not _visible(prompt, scope):
                raise NotFound(prompt_id)
            jobs = (
                await session.execute(
                    select(Job)
                    .where(Job.prompt_id == prompt_id)
                    .order_by(Job.created_at, Job.job_id)
                )
            ).scalars()
            return prompt, list(jobs)

    async def prompts_before(
        self, scope: Scope, limit: int, before: str | None = None
    ) -> list[tuple[Prompt, list[Job]]]:
        """The caller's prompts newest first (by creation, not by what their jobs did), each
        with its jobs oldest first; `before` is the last prompt id of the previous page."""
        stmt = _scoped(select(Prompt), Prompt, scope)
        async with self.sessions() as session:
            if before is not None:
                edge = await session.get(Prompt, before)
                if edge is None or not _visible(edge, scope):
                    raise NotFound(before)
                # prompt_id breaks ties between prompts created in the same microsecond.
                stmt = stmt.where(
                    or_(
                        Prompt.created_at < edge.created_at,
                        and_(Prompt.created_at == edge.created_at, Prompt.prompt_id < before),
                    )
                )
            stmt = stmt.order_by(Prompt.created_at.desc(), Prompt.prompt_id.desc()).limit(limit)
            prompts = list((await session.execute(stmt)).scalars())
            jobs: dict[str, list[Job]] = {prompt.prompt_id: [] for prompt in prompts}
            if prompts:
                rows = await session.execute(
                    select(Job).where(Job.prompt_id.in_(jobs)).order_by(Job.created_at)
                )
                for job in rows.scalars():
                    jobs[job.prompt_id].append(job)
        return [(prompt, jobs[prompt.prompt_id]) for prompt in prompts]

    async def response(self, scope: Scope, response_id: str) -> Response:
        if not _plausible(response_id):
            raise NotFound(response_id)
        async with self.sessions() as session:
            response = await session.get(Response, response_id)
        if response is None or not _visible(response, scope):
            raise NotFound(response_id)
        return response

    async def prompt_of(self, job: Job) -> Prompt:
        async with self.sessions() as session:
            prompt = await session.get(Prompt, job.prompt_id)
        assert prompt is not None
        return prompt

    # -- the dispatcher's scans ---------------------------------------------------------

    async def undispatched(self, limit: int = 200, after: Job | None = None) -> list[Job]:
        """Jobs whose workflow start is not recorded, oldest first; `after` is the last job
        of the previous page. Running ones too: a start may have reached Temporal (an
        attempt runs) without its record, and a second start of the same id is harmless."""
        stmt = select(Job).where(
            Job.dispatched_at.is_(None), Job.state.in_([JobState.QUEUED, JobState.RUNNING])
        )
        return await self._page(
            stmt, Job.created_at, limit, after.created_at if after else None, after
        )

    async def pending_cancels(self, limit: int = 200, after: Job | None = None) -> list[Job]:
        """Cancel requests not yet delivered to a started workflow. A cancelled row too: the
        API cancelled it before its start was recorded, and the workflow must hear it."""
        stmt = select(Job).where(
            Job.cancel_requested_at.is_not(None),
            Job.dispatched_at.is_not(None),
            Job.state.in_([JobState.QUEUED, JobState.RUNNING, JobState.CANCELLED]),
        )
        return await self._page(
            stmt, Job.created_at, limit, after.created_at if after else None, after
        )

    async def unsettled_before(
        self, before: datetime, limit: int = 200, after: Job | None = None
    ) -> list[Job]:
        stmt = select(Job).where(
            Job.dispatched_at.is_not(None),
            Job.state.in_([JobState.QUEUED, JobState.RUNNING]),
            Job.updated_at < before,
        )
        return await self._page(
            stmt, Job.updated_at, limit, after.updated_at if after else None, after
        )

    async def _page(
        self,
        stmt: Select[Any],
        key: Any,
        limit: int,
        after_key: datetime | None,
        after: Job | None,
    ) -> list[Job]:
        """One page of a scan in (`key`, job id) order, after the previous page's last job."""
        if after is not None and after_key is not None:
            stmt = stmt.where(
                or_(key > after_key, and_(key == after_key, Job.job_id > after.job_id))
            )
        async with self.sessions() as session:
            page = stmt.order_by(key, Job.job_id).limit(limit)
            return list((await session.execute(page)).scalars())


def changed_since_query(
    scope: Scope, since: int, limit: int, state: JobState | None = None
) -> Select[Any]:
    """Served by ix_jobs_org[_author][_state]_last_event: an index range scan, no sort."""
    stmt = _scoped(select(Job), Job, scope).where(Job.last_event_id > since)
    if state is not None:
        stmt = stmt.where(Job.state == state)
    return stmt.order_by(Job.last_event_id).limit(limit)


def events_query(
    scope: Scope,
    since: int,
    limit: int,
    job_id: str | None = None,
    prompt_id: str | None = None,
) -> Select[Any]:
    """Served by ix_job_events_org[_author]_id, or the job's or prompt's own index."""
    stmt = _scoped(select(JobEvent), JobEvent, scope).where(JobEvent.id > since)
    if job_id is not None:
        stmt = stmt.where(JobEvent.job_id == job_id)
    if prompt_id is not None:
        stmt = stmt.where(JobEvent.prompt_id == prompt_id)
    return stmt.order_by(JobEvent.id).limit(limit)


def _visible(row: Job | Prompt | Response, scope: Scope) -> bool:
    if scope.all_orgs:
        return True
    return row.org == scope.org and (scope.author is None or row.author == scope.author)
