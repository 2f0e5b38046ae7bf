"""The job store's writes from the API and CLI: accept a submission, a user retry, a cancel
request, and the dispatcher's marks. Each is one transaction; the projector's transitions
(projections/projector.py) are the only other writer."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.db import transaction
from projections.errors import IdempotencyConflict, InvalidState, NotFound
from projections.ids import new_job_id, new_prompt_id
from projections.lifecycle import JobState
from projections.models import Job, Prompt
from projections.projector import (
    Projector,
    Transition,
    append_event,
    apply_in,
    load_for_update,
    lock_event_log,
    utcnow,
)
from projections.scope import Scope, plausible, visible


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


@dataclass
class Submitted:
    """A submission as committed: the prompt and its first job."""

    prompt: Prompt
    job: Job
    created: bool  # False when an Idempotency-Key replay returned the original


class JobWrites:
    sessions: async_sessionmaker[AsyncSession]
    projector: Projector

    async def submit(self, scope: Scope, submission: Submission) -> Submitted:
        """Commit the prompt and its queued job: this commit is the acceptance."""
        fingerprint = submission.fingerprint()
        if submission.idempotency_key is not None:
            replay = await self._idempotent_replay(scope, submission.idempotency_key, fingerprint)
            if replay is not None:
                return replay

        async def write(session: AsyncSession) -> Submitted:
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
            return Submitted(prompt, job, created=True)

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

    async def _idempotent_replay(
        self, scope: Scope, key: str, fingerprint: str
    ) -> Submitted | None:
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
            # The original job, or, once archive removed it (a superseded job can go while
            # its prompt stays), the prompt's current one: the replay names the prompt's work.
            job = (
                await session.execute(
                    select(Job)
                    .where(Job.prompt_id == prompt.prompt_id)
                    .order_by(Job.supersedes.is_not(None), Job.created_at.desc())
                    .limit(1)
                )
            ).scalar_one_or_none()
            if job is None:
                return None  # the archive is removing the prompt right now: submit anew
            return Submitted(prompt, job, created=False)

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
        if not plausible(job_id):
            raise NotFound("job", job_id)
        async with transaction(self.sessions) as session:
            old = await load_for_update(session, job_id)
            now = utcnow()  # under the lock: timestamps follow event order
            if old is None or not visible(old, scope):
                raise NotFound("job", job_id)
            if not old.state.is_retryable_by_user():
                raise InvalidState(old.job_id, old.state, "retry")
            prompt = await session.get(Prompt, old.prompt_id)
            assert prompt is not None
            new = self._new_job(prompt, old.priority, old.max_attempts, now)
            new.supersedes = old.job_id
            session.add(new)
            await append_event(session, new, now)
            superseded = Transition(old.job_id, JobState.SUPERSEDED, superseded_by=new.job_id)
            result = await apply_in(session, old, superseded, now)
            if not result.applied:
                raise InvalidState(old.job_id, old.state, "retry")
        self._notify()
        return new

    async def request_cancel(self, scope: Scope, job_id: str) -> tuple[Job, bool]:
        """Record a cancel request. A job no workflow has been started for is cancelled here and
        now (nothing else could); otherwise the workflow decides, and the flag says so."""
        if not plausible(job_id):
            raise NotFound("job", job_id)
        async with transaction(self.sessions) as session:
            job = await load_for_update(session, job_id)
            now = utcnow()  # under the lock: timestamps follow event order
            if job is None or not visible(job, scope):
                raise NotFound("job", job_id)
            if not job.state.is_cancelable():
                raise InvalidState(job.job_id, job.state, "cancel")
            job.cancel_requested_at = job.cancel_requested_at or now
            if job.dispatched_at is None:
                await apply_in(session, job, Transition(job_id, JobState.CANCELLED), now)
                needs_workflow = False
            else:
                needs_workflow = True
        self._notify()
        return job, needs_workflow

    async def mark_dispatched(self, job_id: str) -> None:
        """Note that the job's workflow is started. A burst of starts shares transactions
        (GroupCommit) with each other and with the submits."""

        async def write(session: AsyncSession) -> None:
            await session.execute(
                update(Job)
                .where(Job.job_id == job_id, Job.dispatched_at.is_(None))
                .values(dispatched_at=utcnow())
            )

        await self.projector.writes.run(write)

    async def mark_undispatched(self, job_id: str) -> None:
        async with transaction(self.sessions) as session:
            await session.execute(
                update(Job).where(Job.job_id == job_id).values(dispatched_at=None)
            )

    async def cancel_delivered(self, job_id: str) -> None:
        async with transaction(self.sessions) as session:
            await session.execute(
                update(Job).where(Job.job_id == job_id).values(cancel_requested_at=None)
            )

    def _notify(self) -> None:
        if self.projector.on_commit is not None:
            self.projector.on_commit()
