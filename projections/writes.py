"""The job store's writes from the API and CLI: accept a submission, a user retry, a cancel
request, and the dispatcher's marks. Each is one transaction, run like the projector's
transitions (projections/projector.py, the only other writer): a plain function of a
`WriteTx`, batched with its neighbours by the process's GroupCommit."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.lifecycle import JobState
from projections.errors import IdempotencyConflict, InvalidState, NotFound, RetryLimit
from projections.event_log import append_event, prepared, utcnow
from projections.group_commit import WriteTx
from projections.ids import new_job_id, new_prompt_id
from projections.models import Base, Job, Prompt, PromptParent, job_options
from projections.projector import (
    JOBS,
    Projector,
    Transition,
    current,
    share_prompts_with_archive,
    transition,
)
from projections.scope import Scope, plausible, visible


@dataclass(frozen=True)
class Submission:
    text: str
    priority: int
    # None: the deployment's default (PROMPTJOBS_MAX_ATTEMPTS_DEFAULT), which JobService
    # fills in before the store sees it.
    max_attempts: int | None
    options: dict[str, Any]
    scheduled_for: datetime | None = None
    idempotency_key: str | None = None
    parent_id: str | None = None
    correlation_id: str | None = None
    after: tuple[str, ...] = ()
    openai: dict[str, Any] | None = None  # Prompt.openai
    # A conversation, as sent (Prompt.messages); `text` is then its transcript, which
    # JobService.check writes.
    messages: list[dict[str, Any]] | None = None
    # The job's own webhook, and the events it wants there (None: its end).
    webhook: str | None = None
    webhook_events: list[str] | None = None

    def fingerprint(self) -> str:
        body = {
            "text": self.text,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "options": self.options,
            "scheduled_for": self.scheduled_for.isoformat() if self.scheduled_for else None,
            "parent_id": self.parent_id,
            "correlation_id": self.correlation_id,
            **({"after": list(self.after)} if self.after else {}),
            **({"openai": self.openai} if self.openai is not None else {}),
            **({"messages": self.messages} if self.messages is not None else {}),
            **({"webhook": self.webhook} if self.webhook is not None else {}),
            **({"webhook_events": self.webhook_events} if self.webhook_events else {}),
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class RetryChanges:
    """What a user retry replaces for the new job; None keeps the old job's."""

    options: dict[str, Any] | None = None
    priority: int | None = None
    max_attempts: int | None = None


@dataclass
class Submitted:
    """A submission as committed: the prompt and its first job."""

    prompt: Prompt
    job: Job
    created: bool  # False when an Idempotency-Key replay returned the original


PROMPTS = Base.metadata.tables[Prompt.__tablename__]
PROMPT_PARENTS = Base.metadata.tables[PromptParent.__tablename__]


class JobWrites:
    sessions: async_sessionmaker[AsyncSession]
    projector: Projector

    async def submit(self, scope: Scope, submission: Submission) -> Submitted:
        """Commit the prompt and its queued job: this commit is the acceptance. A submission
        whose Idempotency-Key was used before is told by the prompts' unique key at the
        insert, not looked up first: a key is almost always new (a client's retry is the
        exception), and the lookup cost a read of its own for every submit with a key (the
        API's CPU per submit tripled: bench/README.md)."""
        fingerprint = submission.fingerprint()

        def write(tx: WriteTx) -> Submitted:
            now = utcnow()
            self._check_parents(tx, scope, submission.after)
            prompt = {
                "prompt_id": new_prompt_id(),
                "org": scope.org,
                "author": scope.user,
                "text": submission.text,
                "messages": submission.messages,
                "options": submission.options,
                "parent_id": submission.parent_id,
                "correlation_id": submission.correlation_id,
                "after": list(submission.after) or None,
                "idempotency_key": submission.idempotency_key,
                "request_hash": fingerprint,
                "openai": submission.openai,
                "created_at": now,
            }
            # Sent with the batch's other submits at the commit (WriteTx.defer).
            prepared(tx, ("insert_prompt",), lambda: insert(PROMPTS)).defer(tx, prompt)
            for position, parent_id in enumerate(submission.after):
                tx.execute(
                    insert(PROMPT_PARENTS),
                    {
                        "prompt_id": prompt["prompt_id"],
                        "position": position,
                        "parent_id": parent_id,
                    },
                )
            assert submission.max_attempts is not None, "JobService fills in the default"
            job = self.new_job(
                tx, prompt, submission.priority, submission.max_attempts, submission.options, now
            )
            job.scheduled_for = submission.scheduled_for
            job.key_id = scope.key_id
            job.webhook, job.webhook_events = submission.webhook, submission.webhook_events
            self.insert_job(tx, job, now)
            return Submitted(Prompt(**prompt), job, created=True)

        try:
            # Concurrent submits share a transaction (GroupCommit); each returns after its commit.
            accepted = await self.projector.writes.run(write)
        except IntegrityError:
            # The Idempotency-Key was used before (a retry), or by a concurrent request that
            # won the race: answer with that submission, or refuse a different body.
            if submission.idempotency_key is None:
                raise
            replay = await self._idempotent_replay(scope, submission.idempotency_key, fingerprint)
            if replay is None:
                raise
            return replay
        self._notify()
        return accepted

    @staticmethod
    def _check_parents(tx: WriteTx, scope: Scope, after: tuple[str, ...]) -> None:
        """Every parent exists and the caller may see it (else the same 404 as any unseen id);
        a parent must exist first, so a chain can have no cycle."""
        if not after:
            return
        found = tx.execute(
            select(PROMPTS.c.prompt_id, PROMPTS.c.org, PROMPTS.c.author).where(
                PROMPTS.c.prompt_id.in_(after)
            )
        )
        seen = {row.prompt_id: Prompt(**row._mapping) for row in found}
        for parent_id in after:
            parent = seen.get(parent_id)
            if parent is None or not visible(parent, scope):
                raise NotFound("prompt", parent_id)

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
    def new_job(
        tx: WriteTx,
        prompt: dict[str, Any],
        priority: int,
        max_attempts: int,
        options: dict[str, Any],
        now: datetime,
    ) -> Job:
        return Job(
            job_id=new_job_id(),
            prompt_id=prompt["prompt_id"],
            org=prompt["org"],
            author=prompt["author"],
            state=JobState.QUEUED,
            priority=priority,
            attempt=0,
            fallback=0,
            key_id=None,
            webhook=None,
            webhook_events=None,
            max_attempts=max_attempts,
            options=options,
            # A chain's child waits on all its parents until its workflow has checked them.
            waiting_on=list(prompt["after"]) if prompt.get("after") else None,
            progress_rank=1,
            input_tokens=0,
            output_tokens=0,
            cost_usd=0.0,
            last_event_id=tx.next_event_id(),
            created_at=now,
            updated_at=now,
        )

    @staticmethod
    def insert_job(tx: WriteTx, job: Job, now: datetime) -> None:
        """The new job's row and its first event, sent with the transaction's next
        statement or its commit (nothing reads them back before)."""
        statement = prepared(tx, ("insert_job",), lambda: insert(JOBS))
        statement.defer(tx, {c.key: getattr(job, c.key) for c in JOBS.c})
        append_event(tx, job, job.last_event_id, now, defer=True)

    async def retry(
        self,
        scope: Scope,
        job_id: str,
        changes: RetryChanges | None = None,
        *,
        max_jobs: int | None = None,
    ) -> Job:
        """A user retry: a new queued job for the same prompt that supersedes `job_id`, with
        the old job's options, priority and max_attempts unless `changes` replaces them.
        A prompt that already has `max_jobs` jobs is refused (RetryLimit): its history, and
        every read of it, stays bounded."""
        changes = changes or RetryChanges()
        if not plausible(job_id):
            raise NotFound("job", job_id)

        def write(tx: WriteTx) -> Job:
            share_prompts_with_archive(tx)
            old = current(tx, job_id, for_update=True)
            now = utcnow()
            if old is None or not visible(old, scope):
                raise NotFound("job", job_id)
            if not old.state.is_retryable_by_user():
                raise InvalidState(old.job_id, old.state, "retry")
            if max_jobs is not None:
                count = select(func.count()).where(JOBS.c.prompt_id == old.prompt_id)
                if tx.execute(count).scalar_one() >= max_jobs:
                    raise RetryLimit(old.job_id, old.prompt_id, max_jobs)
            row = tx.execute(select(PROMPTS).where(PROMPTS.c.prompt_id == old.prompt_id)).first()
            assert row is not None
            prompt = dict(row._mapping)
            new = self.new_job(
                tx,
                prompt,
                old.priority if changes.priority is None else changes.priority,
                old.max_attempts if changes.max_attempts is None else changes.max_attempts,
                job_options(old, Prompt(**prompt)) if changes.options is None else changes.options,
                now,
            )
            new.supersedes = old.job_id
            # Its spend counts against the key that asked for it, else the first job's.
            new.key_id = scope.key_id or old.key_id
            new.webhook, new.webhook_events = old.webhook, old.webhook_events
            self.insert_job(tx, new, now)
            superseded = Transition(old.job_id, JobState.SUPERSEDED, superseded_by=new.job_id)
            if transition(tx, superseded, now) is None:
                raise InvalidState(old.job_id, old.state, "retry")
            return new

        new = await self.projector.writes.run(write)
        self._notify()
        return new

    async def request_cancel(self, scope: Scope, job_id: str) -> tuple[Job, bool]:
        """Record a cancel request. A queued job with no workflow start recorded is cancelled
        here and now (no attempt can be running); otherwise the workflow decides, and the
        flag says so."""
        if not plausible(job_id):
            raise NotFound("job", job_id)

        def write(tx: WriteTx) -> tuple[Job, bool]:
            job = current(tx, job_id, for_update=True)
            now = utcnow()
            if job is None or not visible(job, scope):
                raise NotFound("job", job_id)
            if not job.state.is_cancelable():
                raise InvalidState(job.job_id, job.state, "cancel")
            tx.execute(
                update(JOBS)
                .where(JOBS.c.job_id == job_id)
                .values(cancel_requested_at=func.coalesce(JOBS.c.cancel_requested_at, now))
            )
            job.cancel_requested_at = job.cancel_requested_at or now
            # Queued with no start recorded: no attempt is in flight, and any attempt a start
            # still on its way runs will find the job closed and not call the provider; the
            # dispatcher delivers the cancel to that workflow once it records the start
            # (mark_dispatched). A running job has a workflow, recorded or not: it decides.
            if job.dispatched_at is not None or job.state is not JobState.QUEUED:
                return job, True
            cancelled = transition(tx, Transition(job_id, JobState.CANCELLED), now)
            return cancelled or job, False

        job, needs_workflow = await self.projector.writes.run(write)
        self._notify()
        return job, needs_workflow

    async def mark_dispatched(self, job_id: str) -> bool:
        """Note that the job's workflow is started; True if a cancel was requested meanwhile,
        which the caller must now deliver to the workflow. A burst of starts shares
        transactions (GroupCommit) with each other and with the submits."""

        def write(tx: WriteTx) -> bool:
            statement = prepared(tx, ("mark_dispatched",), _mark_dispatched_statement)
            row = statement.run(tx, {"job_id": job_id, "now": utcnow()})
            return row is not None and row["cancel_requested_at"] is not None

        return bool(await self.projector.writes.run(write))

    async def cancel_delivered(self, job_id: str) -> None:
        await self._set(job_id, cancel_requested_at=None)

    async def _set(self, job_id: str, only_if_unset: str | None = None, **values: Any) -> None:
        where = [JOBS.c.job_id == job_id]
        if only_if_unset is not None:
            where.append(JOBS.c[only_if_unset].is_(None))

        def write(tx: WriteTx) -> None:
            tx.execute(update(JOBS).where(*where).values(values))

        await self.projector.writes.run(write)

    def _notify(self) -> None:
        if self.projector.on_commit is not None:
            self.projector.on_commit()


def _mark_dispatched_statement() -> Any:
    """The first start recorded stays; the row's pending cancel request comes back with it."""
    return (
        update(JOBS)
        .where(JOBS.c.job_id == bindparam("job_id"))
        .values(
            dispatched_at=func.coalesce(
                JOBS.c.dispatched_at, bindparam("now", type_=JOBS.c.dispatched_at.type)
            )
        )
        .returning(JOBS.c.cancel_requested_at)
    )
