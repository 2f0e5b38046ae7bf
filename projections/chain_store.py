"""The projection's side of chains: what a waiting job still waits on, which jobs to wake when
a parent succeeds, and the parents' answers a child's prompt is filled with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.lifecycle import JobState
from projections.group_commit import GroupCommit, WriteTx
from projections.models import Base, Job, PromptParent, Response

JOBS = Base.metadata.tables[Job.__tablename__]

# How many waiting jobs the dispatcher's safety net looks at per pass.
WAKE_BATCH = 500


@dataclass
class ParentsState:
    """The parents of a job's prompt whose current job has not succeeded, and in words."""

    waiting_on: list[str]
    detail: str


def _current(column: Any) -> Any:
    """`column` of a parent's current job (the one no retry has replaced), per parent row."""
    return (
        select(column)
        .where(Job.prompt_id == PromptParent.parent_id, Job.superseded_by.is_(None))
        .order_by(Job.created_at.desc(), Job.job_id.desc())
        .limit(1)
        .scalar_subquery()
    )


def parents_query(prompt_id: str) -> Select[Any]:
    """`prompt_id`'s parents in order, each with its current job's id and state (None: it
    has no job)."""
    return (
        select(PromptParent.parent_id, _current(Job.job_id), _current(Job.state))
        .where(PromptParent.prompt_id == prompt_id)
        .order_by(PromptParent.position)
    )


def parents_state(rows: Sequence[Any]) -> ParentsState:
    """What the parents (`parents_query`'s rows) leave a child waiting on, and in words."""
    waiting: list[str] = []
    words: list[str] = []
    for parent_id, job_id, state in rows:
        if state is not None and JobState(state) is JobState.SUCCEEDED:
            continue
        waiting.append(parent_id)
        if job_id is None:
            words.append(f"{parent_id} (no job)")
        else:
            words.append(f"{parent_id} (job {job_id} {JobState(state).value})")
    return ParentsState(waiting, ", ".join(words))


def waiting_children_query(parent_id: Any) -> Select[str]:
    """The started, still waiting jobs of `parent_id`'s children (to wake on its success);
    `parent_id` a value or a bind parameter."""
    children = select(PromptParent.prompt_id).where(PromptParent.parent_id == parent_id)
    return select(Job.job_id).where(
        Job.prompt_id.in_(children),
        Job.state == JobState.QUEUED,
        Job.waiting_on.is_not(None),
        Job.dispatched_at.is_not(None),
    )


class ChainStore:
    """A chain's rows (`JobStore.chains`): what a child waits on, whom to wake, and the
    parents' answers."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def parents_state(self, prompt_id: str) -> ParentsState:
        """What a child of `prompt_id`'s parents still waits on, read now."""
        async with self.sessions() as session:
            return parents_state((await session.execute(parents_query(prompt_id))).all())

    async def check_parents(self, job_id: str) -> ParentsState:
        """What `job_id` still waits on, recorded on its row while it is queued (no event: its
        state has not changed; a read of the row shows it)."""

        def write(tx: WriteTx) -> ParentsState:
            job = tx.execute(
                select(JOBS.c.prompt_id, JOBS.c.state, JOBS.c.waiting_on).where(
                    JOBS.c.job_id == job_id
                )
            ).first()
            if job is None:
                raise LookupError(f"no job {job_id}")
            state = parents_state(tx.execute(parents_query(job.prompt_id)).all())
            now_waiting = state.waiting_on or None
            if JobState(job.state) is JobState.QUEUED and job.waiting_on != now_waiting:
                tx.execute(
                    update(JOBS)
                    .where(JOBS.c.job_id == job_id, JOBS.c.state == JobState.QUEUED)
                    .values(waiting_on=now_waiting)
                )
            return state

        return await self.writes.run(write)

    async def waiting_children(self, parent_id: str) -> list[str]:
        async with self.sessions() as session:
            return list((await session.execute(waiting_children_query(parent_id))).scalars())

    async def ready_to_wake(self) -> list[str]:
        """Waiting jobs whose parents have all succeeded: a wake-up signal they should have had
        (its sender died after the parent's commit) and did not act on."""
        stmt = (
            select(Job)
            .where(
                Job.state == JobState.QUEUED,
                Job.waiting_on.is_not(None),
                Job.dispatched_at.is_not(None),
            )
            .limit(WAKE_BATCH)
        )
        ready: list[str] = []
        async with self.sessions() as session:
            for job in list((await session.execute(stmt)).scalars()):
                rows = (await session.execute(parents_query(job.prompt_id))).all()
                if not parents_state(rows).waiting_on:
                    ready.append(job.job_id)
        return ready

    async def parent_answers(self, parent_ids: list[str]) -> dict[str, str]:
        """Each parent's answer: the response of its newest succeeded job."""
        answers: dict[str, str] = {}
        async with self.sessions() as session:
            for parent_id in parent_ids:
                stmt = (
                    select(Response.text)
                    .where(Response.prompt_id == parent_id)
                    .order_by(Response.created_at.desc())
                    .limit(1)
                )
                text = (await session.execute(stmt)).scalar_one_or_none()
                if text is None:
                    raise LookupError(f"parent prompt {parent_id} has no response")
                answers[parent_id] = text
        return answers
