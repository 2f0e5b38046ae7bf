"""The job store's reads, each scoped to the caller: one job, changes after a cursor, events,
prompts with their jobs, responses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import JSON, ColumnElement, Select, Text, and_, case, func, or_, select, type_coerce
from sqlalchemy import cast as sql_cast
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute, aliased, defer
from sqlalchemy.orm.attributes import set_committed_value

from projections.domain.lifecycle import ErrorKind, EventType, JobState
from projections.event_log import utcnow
from projections.models import (
    AttemptRecord,
    Job,
    JobEvent,
    JobOutput,
    Prompt,
    PromptParent,
    Response,
)
from projections.prepared import VisibleHorizon
from projections.rows import LISTED_OPTIONS_BYTES
from projections.scope import Scope, get_visible, scoped

# How long after a job settled its last attempt may still be writing its final text (a worker
# that died meanwhile never will: past this the output counts as final anyway).
OUTPUT_SETTLE = timedelta(seconds=30)

# A listing of prompts shows this many of each prompt's jobs, the newest; the prompt's own page
# shows them all.
LISTED_JOBS = 10


@dataclass
class Page:
    """One page of `jobs_changed_since`: the jobs, and the cursor to pass next."""

    jobs: list[Job]
    next_cursor: int


@dataclass
class Output:
    """A job's streamed text as `output` read it: the job row, the attempt the text is of,
    where the text starts and the text."""

    job: Job
    attempt: int
    offset: int
    text: str
    done: bool
    tool_calls: list[dict[str, str]] | None = None


# Job ids per query of a worker's watch (an IN list of this many at most).
WATCH_CHUNK = 500


@dataclass(frozen=True)
class AttemptStanding:
    """Where a job's current attempt stands, as a worker's watch reads it."""

    state: JobState
    attempt: int
    cancel_requested: bool


@dataclass(frozen=True)
class SpendLine:
    """What the attempts of one provider's model, for one user's jobs, consumed."""

    provider: str
    model: str
    user: str
    attempts: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    # Attempts on a model the price table does not price: their cost is not in `cost_usd`.
    unpriced: int
    # Whether they ended in the read's recent part (`JobReads.spend`).
    recent: bool = False
    # The API key that submitted the jobs (None: before migration 0022, or made otherwise).
    key_id: str | None = None


class JobReads:
    sessions: async_sessionmaker[AsyncSession]

    async def job(self, scope: Scope, job_id: str) -> Job:
        async with self.sessions() as session:
            return await get_visible(session, Job, "job", job_id, scope)

    async def job_and_prompt(self, job_id: str) -> tuple[Job, Prompt]:
        """A job and its prompt, whoever's they are: what a worker's attempt runs."""
        async with self.sessions() as session:
            job = await session.get(Job, job_id)
            assert job is not None, job_id
            prompt = await session.get(Prompt, job.prompt_id)
            assert prompt is not None, job.prompt_id
            return job, prompt

    async def attempts_standing(self, job_ids: list[str]) -> dict[str, AttemptStanding]:
        """Where each of these jobs' current attempt stands (a worker's watch of the calls
        it runs: one query per WATCH_CHUNK jobs)."""
        found: dict[str, AttemptStanding] = {}
        async with self.sessions() as session:
            for start in range(0, len(job_ids), WATCH_CHUNK):
                chunk = job_ids[start : start + WATCH_CHUNK]
                rows = await session.execute(
                    select(Job.job_id, Job.state, Job.attempt, Job.cancel_requested_at).where(
                        Job.job_id.in_(chunk)
                    )
                )
                for job_id, state, attempt, cancel_at in rows.all():
                    found[job_id] = AttemptStanding(state, attempt, cancel_at is not None)
        return found

    async def output(self, scope: Scope, job_id: str, since: int) -> Output:
        """The text the job's current attempt has streamed, from character `since` on (from
        its end, if `since` is past it), and its tool calls so far. One snapshot: the job and
        its output read together."""
        async with self.sessions() as session:
            job = await get_visible(session, Job, "job", job_id, scope)
            stored = await session.get(JobOutput, job_id)
            ended = job.attempt == 0 or (
                await session.get(AttemptRecord, (job_id, job.attempt)) is not None
            )
        # Final once the job has settled and its last attempt has ended: a call cut by a
        # cancel writes its last text with its usage record, just after the row settles.
        done = job.state.is_terminal and (
            ended
            or job.state in (JobState.SUCCEEDED, JobState.SUPERSEDED)
            or job.finished_at is None
            or utcnow() - job.finished_at > OUTPUT_SETTLE
        )
        if stored is None or stored.attempt != job.attempt:
            # Nothing streamed by this attempt yet (an earlier one's text was reset).
            return Output(job, job.attempt, 0, "", done)
        offset = min(max(since, 0), stored.length)
        return Output(job, stored.attempt, offset, stored.text[offset:], done, stored.tool_calls)

    async def last_miss(self, job_id: str, before: int) -> dict[str, Any] | None:
        """What the job's latest attempt before `before` that missed its output schema
        answered and why (AttemptRecord.detail), if one did: the next repair turn."""
        async with self.sessions() as session:
            stmt = (
                select(AttemptRecord.detail)
                .where(
                    AttemptRecord.job_id == job_id,
                    AttemptRecord.attempt < before,
                    AttemptRecord.outcome == ErrorKind.SCHEMA_MISMATCH.value,
                )
                .order_by(AttemptRecord.attempt.desc())
                .limit(1)
            )
            return (await session.execute(stmt)).scalar_one_or_none()

    async def spend(self, scope: Scope, since: datetime, recent: datetime) -> list[SpendLine]:
        """What the caller's attempts that ended at or after `since` consumed (an admin: the
        org's), per provider, model, the user and the key that submitted each job, and whether
        they ended at or after `recent` too (a month's and its last day's, in one read)."""
        is_recent = case((AttemptRecord.ended_at >= recent, True), else_=False)
        by_place = cast(
            Select[Any],
            select(
                AttemptRecord.provider,
                AttemptRecord.model,
                Job.author,
                Job.key_id,
                is_recent,
                func.count(),
                func.coalesce(func.sum(AttemptRecord.input_tokens), 0),
                func.coalesce(func.sum(AttemptRecord.output_tokens), 0),
                func.coalesce(func.sum(AttemptRecord.cost_usd), 0.0),
                func.count() - func.count(AttemptRecord.cost_usd),
            )
            .join(Job, Job.job_id == AttemptRecord.job_id)
            .where(AttemptRecord.ended_at >= since)
            .group_by(
                AttemptRecord.provider, AttemptRecord.model, Job.author, Job.key_id, is_recent
            ),
        )
        async with self.sessions() as session:
            rows = (await session.execute(scoped(by_place, Job, scope))).all()
        return [
            SpendLine(p, m, a, int(n), int(i), int(o), round(float(c), 9), int(u), bool(r), k)
            for p, m, a, k, r, n, i, o, c, u in rows
        ]

    async def attempt_record(self, job_id: str, attempt: int) -> AttemptRecord | None:
        """Attempt `attempt` of the job as it was recorded, if it was (a worker lost during
        it recorded nothing)."""
        async with self.sessions() as session:
            return await session.get(AttemptRecord, (job_id, attempt))

    async def attempts(self, scope: Scope, job_id: str) -> tuple[Job, list[AttemptRecord]]:
        """The job and each of its attempts that recorded what it consumed, oldest first."""
        async with self.sessions() as session:
            job = await get_visible(session, Job, "job", job_id, scope)
            stmt = (
                select(AttemptRecord)
                .where(AttemptRecord.job_id == job_id)
                .order_by(AttemptRecord.attempt)
            )
            return job, list((await session.execute(stmt)).scalars())

    async def jobs_changed_since(
        self, scope: Scope, since: int, limit: int, state: JobState | None = None
    ) -> Page:
        """The caller's jobs whose last change is after `since`, in change order.

        The log's newest final id (below `VisibleHorizon`: no transaction still in flight
        can add an event below it) is read first, so the query that follows sees every
        change up to that id; a page shorter than `limit` therefore holds every job changed
        after `since`, and the cursor may move to that id (or the page's last change, if
        later) even when no job of the caller's changed or none matched `state`. A job whose
        last change is not final yet waits for the next page. An empty page means: caught
        up."""
        async with self.sessions() as session:
            newest = await self._newest_event_id(session)
            stmt = changed_since_query(scope, since, limit, state)
            jobs = await listed_jobs(session, stmt, Job.options)
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
        until: int | None = None,
    ) -> list[JobEvent]:
        """The caller's events after `since` (and up to `until`), in log order."""
        stmt = events_query(scope, since, limit, job_id, prompt_id)
        if until is not None:
            stmt = stmt.where(JobEvent.id <= until)
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def events_after(self, after: int, limit: int) -> list[JobEvent]:
        """Every org's events after `after`, in log order: what an API process's one reader
        tails (api/changes.py). Only final events (`VisibleHorizon`: below every transaction
        still in flight), so whatever this returns has no smaller id still to come."""
        stmt = (
            select(JobEvent)
            .where(JobEvent.id > after, JobEvent.id < VisibleHorizon())
            .order_by(JobEvent.id)
            .limit(limit)
        )
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def job_events(
        self,
        scope: Scope,
        job_id: str,
        kinds: tuple[EventType, ...] = (EventType.STATE_CHANGED,),
    ) -> list[JobEvent]:
        """The job's events of these kinds in log order: by default its transitions."""
        await self.job(scope, job_id)
        async with self.sessions() as session:
            stmt = (
                select(JobEvent)
                .where(JobEvent.job_id == job_id, JobEvent.type.in_(kinds))
                .order_by(JobEvent.id)
            )
            return list((await session.execute(stmt)).scalars())

    async def job_over_at(self, scope: Scope, job_id: str) -> int | None:
        """Where the job's event stream ends: the id of its `job.done`; or, for a job settled
        longer than OUTPUT_SETTLE ago without one (its last attempt's worker died while it
        was being cancelled, or it settled before `job.done` was logged), its newest event.
        None while its run goes on."""
        job = await self.job(scope, job_id)
        newest = select(func.max(JobEvent.id)).where(JobEvent.job_id == job_id)
        async with self.sessions() as session:
            done = await session.scalar(newest.where(JobEvent.type == EventType.DONE))
            if done is not None:
                return int(done)
            settled = job.finished_at
            if job.state.is_terminal and settled and settled < utcnow() - OUTPUT_SETTLE:
                last = await session.scalar(newest)
                return int(last) if last is not None else 0
        return None

    async def latest_event_id(self) -> int:
        async with self.sessions() as session:
            return await self._newest_event_id(session)

    @staticmethod
    async def _newest_event_id(session: AsyncSession) -> int:
        newest = select(func.max(JobEvent.id)).where(JobEvent.id < VisibleHorizon())
        return int((await session.execute(newest)).scalar() or 0)

    async def prompt(self, scope: Scope, prompt_id: str) -> tuple[Prompt, list[Job]]:
        """The prompt and every job it has had, oldest first: at most `max_jobs_per_prompt`,
        since a retry past that is refused."""
        async with self.sessions() as session:
            prompt = await get_visible(session, Prompt, "prompt", prompt_id, scope)
            jobs = (
                await session.execute(
                    select(Job)
                    .where(Job.prompt_id == prompt_id)
                    .order_by(Job.created_at, Job.job_id)
                )
            ).scalars()
            return prompt, list(jobs)

    async def children(self, scope: Scope, prompt_ids: list[str]) -> dict[str, list[str]]:
        """For each prompt, the chain's children the caller may see (oldest first)."""
        found: dict[str, list[str]] = {prompt_id: [] for prompt_id in prompt_ids}
        if not prompt_ids:
            return found
        edges = cast(
            Select[Any],
            select(PromptParent.parent_id, Prompt.prompt_id).join(
                Prompt, Prompt.prompt_id == PromptParent.prompt_id
            ),
        )
        stmt = scoped(edges, Prompt, scope).where(PromptParent.parent_id.in_(prompt_ids))
        async with self.sessions() as session:
            rows = await session.execute(stmt.order_by(Prompt.created_at, Prompt.prompt_id))
            for parent_id, child_id in rows.all():
                found[parent_id].append(child_id)
        return found

    async def prompts_before(
        self, scope: Scope, limit: int, before: str | None = None
    ) -> list[tuple[Prompt, list[Job], int]]:
        """The caller's prompts newest first (by creation, not by what their jobs did), each
        with its newest LISTED_JOBS jobs oldest first (the last is the current one) and how
        many it has; `before` is the last prompt id of the previous page."""
        stmt = scoped(select(Prompt), Prompt, scope)
        async with self.sessions() as session:
            if before is not None:
                edge = await get_visible(session, Prompt, "prompt", before, scope)
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
            counts: dict[str, int] = dict.fromkeys(jobs, 0)
            if prompts:
                newest_first = (Job.created_at.desc(), Job.job_id.desc())
                ranked = (
                    select(
                        Job,
                        func.row_number()
                        .over(partition_by=Job.prompt_id, order_by=newest_first)
                        .label("rank"),
                        func.count().over(partition_by=Job.prompt_id).label("total"),
                    )
                    .where(Job.prompt_id.in_(jobs))
                    .subquery()
                )
                listed = aliased(Job, ranked)
                rows = await listed_jobs(
                    session,
                    select(listed, ranked.c.total)
                    .where(ranked.c.rank <= LISTED_JOBS)
                    .order_by(ranked.c.created_at, ranked.c.job_id),
                    listed.options,
                    with_row=True,
                )
                for job, total in rows:
                    jobs[job.prompt_id].append(job)
                    counts[job.prompt_id] = total
        return [(prompt, jobs[prompt.prompt_id], counts[prompt.prompt_id]) for prompt in prompts]

    async def response(self, scope: Scope, response_id: str) -> Response:
        async with self.sessions() as session:
            return await get_visible(session, Response, "response", response_id, scope)

    async def prompt_of(self, job: Job) -> Prompt:
        async with self.sessions() as session:
            prompt = await session.get(Prompt, job.prompt_id)
        assert prompt is not None
        return prompt


async def listed_jobs(
    session: AsyncSession,
    stmt: Select[Any],
    options: InstrumentedAttribute[dict[str, Any] | None],
    *,
    with_row: bool = False,
) -> list[Any]:
    """The jobs `stmt` selects (its first entity; `options` is that entity's column), as a
    listing carries them: options longer than LISTED_OPTIONS_BYTES are neither read from
    the database nor held (`options_omitted` says so), so a page of jobs with 100 kB
    `system`s weighs what a page of ordinary ones does. With `with_row`, each job comes
    with the rest of its row: (job, *other columns)."""
    # The stored JSON's length: rows.options_weight in SQL.
    size = func.length(sql_cast(options, Text))
    short: ColumnElement[Any] = type_coerce(
        case((size <= LISTED_OPTIONS_BYTES, options), else_=None), JSON
    )
    rows = await session.execute(
        stmt.add_columns(short, size > LISTED_OPTIONS_BYTES).options(defer(options))
    )
    listed: list[Any] = []
    for job, *rest, kept, omitted in rows.all():
        set_committed_value(job, "options", kept)
        job.options_omitted = bool(omitted)
        listed.append((job, *rest) if with_row else job)
    return listed


def changed_since_query(
    scope: Scope, since: int, limit: int, state: JobState | None = None
) -> Select[Any]:
    """Served by ix_jobs_org[_author][_state]_last_event: an index range scan, no sort."""
    stmt = scoped(select(Job), Job, scope).where(
        Job.last_event_id > since, Job.last_event_id < VisibleHorizon()
    )
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
    """Served by ix_job_events_org[_author]_id, or the job's or prompt's own index. Only final
    events (`VisibleHorizon`): a cursor past them never skips one committed later."""
    stmt = scoped(select(JobEvent), JobEvent, scope).where(
        JobEvent.id > since, JobEvent.id < VisibleHorizon()
    )
    if job_id is not None:
        stmt = stmt.where(JobEvent.job_id == job_id)
    if prompt_id is not None:
        stmt = stmt.where(JobEvent.prompt_id == prompt_id)
    return stmt.order_by(JobEvent.id).limit(limit)
