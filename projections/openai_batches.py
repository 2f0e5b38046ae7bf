"""Batches of OpenAI's Batch API: the batch row, the lines its input file became (each one
prompt and its job), and the counts and pages its status and output files are made from."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections import webhooks
from projections.domain.lifecycle import JobState
from projections.errors import NotFound
from projections.event_log import utcnow
from projections.group_commit import GroupCommit, WriteTx
from projections.ids import new_prompt_id
from projections.models import Base, Batch, BatchLine, Job, Prompt, Response
from projections.scope import Scope, get_visible, newest_first, scoped
from projections.writes import PROMPTS, JobWrites, Submission

BATCHES = Base.metadata.tables[Batch.__tablename__]
LINES = Base.metadata.tables[BatchLine.__tablename__]

# Statuses a batch is still worked on in (the sweep's); the rest are final.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL_STATES = [state for state in JobState if state.is_terminal]


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Line:
    """One accepted line: its number (from 0), `custom_id` and what it submits."""

    line: int
    custom_id: str
    submission: Submission


@dataclass(frozen=True)
class Outcome:
    """A line as its batch's output or error file tells it."""

    line: int
    custom_id: str
    prompt: Prompt
    job: Job
    response: Response | None


class BatchStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def create(self, scope: Scope, values: dict[str, Any]) -> Batch:
        row = {
            "batch_id": new_batch_id(),
            "org": scope.org,
            "author": scope.user,
            "status": "validating",
            "total": 0,
            "accepted": 0,
            "completed": 0,
            "failed": 0,
            "created_at": utcnow(),
            **values,
        }
        # The table's column is `metadata`; the model's attribute `meta`.
        columns = {("metadata" if key == "meta" else key): value for key, value in row.items()}
        await self.writes.run(lambda tx: tx.execute(insert(BATCHES), columns))
        return Batch(**row)

    async def get(self, scope: Scope, batch_id: str) -> Batch:
        async with self.sessions() as session:
            return await get_visible(session, Batch, "batch", batch_id, scope)

    async def row(self, batch_id: str) -> Batch:
        async with self.sessions() as session:
            batch = await session.get(Batch, batch_id)
        if batch is None:
            raise NotFound("batch", batch_id)
        return batch

    async def page(self, scope: Scope, *, limit: int, after: str | None) -> list[Batch]:
        """The caller's batches, newest first; `after`: those older than that batch."""
        anchor = await self.get(scope, after) if after is not None else None
        stmt = scoped(select(Batch), Batch, scope)
        stmt = newest_first(stmt, Batch.created_at, Batch.batch_id, anchor).limit(limit)
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def active(self) -> list[Batch]:
        """Every org's batches not yet over, oldest first: what the sweep works on."""
        stmt = select(Batch).where(Batch.status.in_(ACTIVE)).order_by(Batch.created_at)
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def move(
        self, batch_id: str, to: str, *, came_from: tuple[str, ...], **values: Any
    ) -> bool:
        """Set the batch's status to `to` (and `values`) if it is one of `came_from`: of
        processes sweeping at once, one moves it."""

        def write(tx: WriteTx) -> bool:
            moved = tx.execute(
                update(BATCHES)
                .where(BATCHES.c.batch_id == batch_id, BATCHES.c.status.in_(came_from))
                .values(status=to, **values)
            )
            if moved.rowcount and f"batch.{to}" in webhooks.BATCH_ENDS:
                org = tx.execute(select(BATCHES.c.org).where(BATCHES.c.batch_id == batch_id))
                webhooks.tell_batch(tx, org.scalar_one(), batch_id, to, utcnow())
            return bool(moved.rowcount)

        return await self.writes.run(write)

    async def accept(self, batch: Batch, first: int, lines: list[Line]) -> bool:
        """Commit `lines` (numbered from `first`, the batch's `accepted` so far) as prompts
        and queued jobs in one transaction; False if another process accepted them first."""

        def write(tx: WriteTx) -> bool:
            moved = tx.execute(
                update(BATCHES)
                .where(
                    BATCHES.c.batch_id == batch.batch_id,
                    BATCHES.c.accepted == first,
                    BATCHES.c.status == "validating",
                )
                .values(accepted=first + len(lines))
            )
            if not moved.rowcount:
                return False
            now = utcnow()
            prompts, edges = [], []
            for line in lines:
                submission = line.submission
                prompt = {
                    "prompt_id": new_prompt_id(),
                    "org": batch.org,
                    "author": batch.author,
                    "text": submission.text,
                    "messages": submission.messages,
                    "options": submission.options,
                    "parent_id": None,
                    "correlation_id": batch.batch_id,
                    "after": None,
                    "idempotency_key": None,
                    "request_hash": None,
                    "openai": submission.openai,
                    "created_at": now,
                }
                prompts.append(prompt)
                edges.append(
                    {
                        "batch_id": batch.batch_id,
                        "line": line.line,
                        "custom_id": line.custom_id,
                        "prompt_id": prompt["prompt_id"],
                    }
                )
            tx.conn.execute(insert(PROMPTS), prompts)
            tx.conn.execute(insert(LINES), edges)
            for line, prompt in zip(lines, prompts, strict=True):
                submission = line.submission
                assert submission.max_attempts is not None, "JobService fills in the default"
                job = JobWrites.new_job(
                    tx,
                    prompt,
                    submission.priority,
                    submission.max_attempts,
                    submission.options,
                    now,
                )
                JobWrites.insert_job(tx, job, now)
            return True

        return await self.writes.run(write)

    async def counts(self, batch_id: str) -> dict[JobState, int]:
        """How many of the batch's lines' current jobs are in each state."""
        stmt = (
            select(Job.state, func.count())
            .join(LINES, LINES.c.prompt_id == Job.prompt_id)
            .where(LINES.c.batch_id == batch_id, Job.superseded_by.is_(None))
            .group_by(Job.state)
        )
        async with self.sessions() as session:
            rows = (await session.execute(stmt)).all()
        return {state: int(count) for state, count in rows}

    async def open_jobs(self, batch_id: str, limit: int) -> list[Job]:
        """Up to `limit` of the batch's jobs not settled and not yet asked to cancel."""
        stmt = (
            select(Job)
            .join(LINES, LINES.c.prompt_id == Job.prompt_id)
            .where(
                LINES.c.batch_id == batch_id,
                Job.state.not_in(TERMINAL_STATES),
                Job.cancel_requested_at.is_(None),
            )
            .limit(limit)
        )
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def outcomes(self, batch_id: str, after: int, limit: int) -> list[Outcome]:
        """The lines after line `after`, in order, with their current jobs and answers."""
        stmt = (
            select(LINES.c.line, LINES.c.custom_id, Prompt, Job, Response)
            .join(Prompt, Prompt.prompt_id == LINES.c.prompt_id)
            .join(Job, and_(Job.prompt_id == LINES.c.prompt_id, Job.superseded_by.is_(None)))
            .outerjoin(Response, Response.response_id == Job.response_id)
            .where(LINES.c.batch_id == batch_id, LINES.c.line > after)
            .order_by(LINES.c.line)
            .limit(limit)
        )
        async with self.sessions() as session:
            rows = (await session.execute(stmt)).all()
        return [Outcome(*row) for row in rows]


def timestamp(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())
