"""The projection's side of chains: what a waiting job still waits on, which jobs to wake when
a parent succeeds, and the parents' answers a child's prompt is filled with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.lifecycle import JobState
from projections.engines import transaction
from projections.models import Job, PromptParent, Response

# How many waiting jobs the dispatcher's safety net looks at per pass.
WAKE_BATCH = 500


@dataclass
class ParentsState:
    """The parents of a job's prompt whose current job has not succeeded, and in words."""

    waiting_on: list[str]
    detail: str


async def _current_job(session: AsyncSession, prompt_id: str) -> Job | None:
    """A prompt's current job: the one no retry has replaced."""
    stmt = (
        select(Job)
        .where(Job.prompt_id == prompt_id, Job.superseded_by.is_(None))
        .order_by(Job.created_at.desc(), Job.job_id.desc())
        .limit(1)
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def _parents_state(session: AsyncSession, prompt_id: str) -> ParentsState:
    stmt = (
        select(PromptParent.parent_id)
        .where(PromptParent.prompt_id == prompt_id)
        .order_by(PromptParent.position)
    )
    waiting: list[str] = []
    words: list[str] = []
    for parent_id in (await session.execute(stmt)).scalars():
        current = await _current_job(session, parent_id)
        if current is not None and current.state is JobState.SUCCEEDED:
            continue
        waiting.append(parent_id)
        if current is None:
            words.append(f"{parent_id} (no job)")
        else:
            words.append(f"{parent_id} (job {current.job_id} {current.state.value})")
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

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def parents_state(self, prompt_id: str) -> ParentsState:
        """What a child of `prompt_id`'s parents still waits on, read now."""
        async with self.sessions() as session:
            return await _parents_state(session, prompt_id)

    async def check_parents(self, job_id: str) -> ParentsState:
        """What `job_id` still waits on, recorded on its row while it is queued (no event: its
        state has not changed; a read of the row shows it)."""
        async with transaction(self.sessions) as session:
            job = await session.get(Job, job_id)
            if job is None:
                raise LookupError(f"no job {job_id}")
            state = await _parents_state(session, job.prompt_id)
            now_waiting = state.waiting_on or None
            if job.state is JobState.QUEUED and job.waiting_on != now_waiting:
                await session.execute(
                    update(Job)
                    .where(Job.job_id == job_id, Job.state == JobState.QUEUED)
                    .values(waiting_on=now_waiting)
                )
            return state

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
                if not (await _parents_state(session, job.prompt_id)).waiting_on:
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
