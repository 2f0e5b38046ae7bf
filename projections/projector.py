"""The idempotent projector: applies job transitions to the job rows and appends job events.

Every write here is a plain function of a `WriteTx` (projections/group_commit.py): it runs on a
synchronous connection inside the one thread hop of its transaction. A transition is one
guarded `UPDATE jobs ... WHERE state IN (...) AND progress_rank < ...`, so the database
itself refuses an illegal or stale transition, plus one `INSERT` into job_events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Integer, Row, bindparam, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections import budgets, webhooks
from projections.admission import Waiting, admit
from projections.budgets import BudgetWait, Draw
from projections.chain_store import waiting_children_query
from projections.domain.lifecycle import (
    AttemptResult,
    ErrorKind,
    EventType,
    JobState,
    lost_attempt_message,
    progress_rank,
    sources_of,
)
from projections.event_log import append_event, prepared, utcnow
from projections.group_commit import GroupCommit, WriteTx, dialect_insert
from projections.models import Base, Job, Prompt, Response
from projections.streams import (
    AttemptUsage,
    OutputBatch,
    OutputWritten,
    append_outputs,
    log_done,
    record_attempt,
    reset_output,
    run_is_over,
)

STATE_CHANGED = EventType.STATE_CHANGED
JOBS = Base.metadata.tables[Job.__tablename__]
RESPONSES = Base.metadata.tables[Response.__tablename__]
PROMPTS = Base.metadata.tables[Prompt.__tablename__]

# Taken shared by a user retry, exclusive by `jobs archive` (PostgreSQL), so an archive cannot
# remove a prompt a retry is adding a job to. No other writer takes it.
PROMPT_ARCHIVE_LOCK = 7215001


@dataclass(frozen=True)
class Transition:
    """One change a job asks for. `attempt` None means "whatever attempt the row is at"."""

    job_id: str
    target: JobState
    attempt: int | None = None
    error_kind: ErrorKind | None = None
    error_message: str | None = None
    next_attempt_at: datetime | None = None
    worker: str | None = None
    response_id: str | None = None
    superseded_by: str | None = None
    # A succeeded transition is only valid for the attempt that produced the result.
    require_current_attempt: bool = False
    # A re-queue or a start that moves the job to another of its places (`options.fallbacks`).
    fallback: int | None = None


@dataclass(frozen=True)
class Moved:
    """An attempt that starts at another of its job's places (`options.fallbacks`): which
    (the index the job's row keeps), and why, for the attempt's record."""

    place: int
    why: str
    # If the new place has no room either: ask again within this long.
    again_s: float | None = None


class Places(Protocol):
    """Where a job's attempt starts, decided in its start's transaction (the worker's view
    of the circuits and of each job's places: activities/circuits.py)."""

    @property
    def choosing(self) -> bool:
        """Whether an attempt may start elsewhere than its place, whatever its budget (a
        circuit is tripped): then the start reads the job to ask `at_start`."""
        ...

    def at_start(self, tx: WriteTx, job: Job, prompt: Prompt) -> Moved | None: ...

    def when_busy(
        self, tx: WriteTx, job: Job, prompt: Prompt, waited_s: float
    ) -> Moved | float | None:
        """The job's budget has no room, and it has waited `waited_s` for it: another place
        to start at now, or the seconds after which to ask again (to move on then), or
        None (wait as the budget says)."""
        ...


@dataclass
class Applied:
    """What the projector did: whether the transition took, and the row as it now stands."""

    applied: bool
    state: JobState
    attempt: int
    event_ids: list[int] = field(default_factory=list)
    error_kind: ErrorKind | None = None
    error_message: str | None = None
    # Set when the attempt could not start because its org has no free slot.
    waiting: Waiting | None = None
    # Set when it could not start because its provider budget has no room now.
    budget_wait: BudgetWait | None = None
    # The provider budget the attempt's call draws on, and whether it took a draw.
    draw: Draw | None = None
    drew: bool = False
    # Whether the call probes its budget's limits (projections/budgets.Probe), drawing or not
    # (an org's quota, a spend cap: it draws all the same).
    probing: bool = False
    # An attempt that started: its row and its prompt, read in the same transaction (the
    # call needs both; a read of its own cost the worker more than the write).
    job: Job | None = None
    prompt: Prompt | None = None
    # An attempt started at another of its job's places (its own one's circuit open, or its
    # budget kept the job waiting too long): where, and why.
    moved: Moved | None = None
    # A success: the started jobs of the prompt's chained children that wait on their
    # parents, to be woken (read in the same transaction; the dispatcher's safety net,
    # chain_store.ready_to_wake, catches a child that began waiting meanwhile).
    waiting_children: list[str] = field(default_factory=list)


def job_of(row: Row[Any]) -> Job:
    """A detached Job holding a row's values (the caller's copy; no session tracks it)."""
    return Job(**row._mapping)


def _guard(t: Transition) -> list[ColumnElement[bool]]:
    """The WHERE clause that makes the database refuse an illegal or stale transition."""
    where = [
        JOBS.c.job_id == bindparam("g_job_id", None),
        JOBS.c.state.in_(sources_of(t.target, t.error_kind)),
        # Its event must come after the row's last: see `transition`.
        JOBS.c.last_event_id < bindparam("v_last_event_id", None, type_=JOBS.c.last_event_id.type),
    ]
    if t.require_current_attempt:
        where.append(JOBS.c.attempt == bindparam("g_attempt", None, type_=Integer()))
    if not t.target.is_terminal:
        where.append(JOBS.c.progress_rank < _rank(t))
    return where


def _rank(t: Transition) -> Any:
    if t.attempt is not None:
        return bindparam("g_rank", None, type_=Integer())
    # The row's own attempt: a rank is linear in the attempt (2n, 2n + 1).
    return progress_rank(t.target, 0) + 2 * JOBS.c.attempt


def _changes(t: Transition, event_id: int, now: datetime) -> dict[str, Any]:
    """The SET clause's values: the row after `t`, in the same statement as its guard."""
    values: dict[str, Any] = {"state": t.target, "updated_at": now, "last_event_id": event_id}
    if t.attempt is not None:
        values["attempt"] = t.attempt
    if t.target is JobState.RUNNING:
        values.update(
            worker=t.worker, next_attempt_at=None, attempt_started_at=now, waiting_for=None
        )
    elif t.target is JobState.QUEUED:
        values["next_attempt_at"] = t.next_attempt_at
    if t.fallback is not None:
        values["fallback"] = t.fallback
    if t.error_kind is not None:
        values.update(error_kind=t.error_kind, error_message=t.error_message)
    if t.target is JobState.SUCCEEDED:
        values.update(response_id=t.response_id, error_kind=None, error_message=None)
    if t.target is JobState.SUPERSEDED:
        values["superseded_by"] = t.superseded_by
    elif t.target.is_terminal:
        values.update(next_attempt_at=None, finished_at=now, waiting_for=None)
    return values


def _transition_statement(t: Transition) -> Any:
    """UPDATE jobs SET ... WHERE <guard> RETURNING *, for every transition of `t`'s shape."""
    values: dict[str, Any] = {
        column: bindparam(f"v_{column}", None, type_=JOBS.c[column].type)
        for column in _changes(t, 0, utcnow())
    }
    if not t.target.is_terminal:
        values["progress_rank"] = _rank(t)
    if t.target is JobState.RUNNING:
        values["started_at"] = func.coalesce(
            JOBS.c.started_at, bindparam("v_updated_at", None, type_=JOBS.c.updated_at.type)
        )
    return update(JOBS).where(*_guard(t)).values(values).returning(*JOBS.c)


def _shape(t: Transition) -> tuple[Any, ...]:
    return (
        t.target,
        t.attempt is None,
        t.require_current_attempt,
        t.error_kind is not None,
        sources_of(t.target, t.error_kind),
        t.fallback is not None,
    )


def transition(tx: WriteTx, t: Transition, now: datetime, *, tell: bool = True) -> Job | None:
    """Apply `t` if the row allows it: the row as it now stands, or None if refused. `tell`
    False: the caller writes its webhook deliveries itself (a success, once its response
    says how it finished)."""
    event_id = tx.next_event_id()
    statement = prepared(tx, ("transition", *_shape(t)), lambda: _transition_statement(t))
    params = {f"v_{column}": value for column, value in _changes(t, event_id, now).items()}
    params["g_job_id"] = t.job_id
    if t.require_current_attempt:
        params["g_attempt"] = t.attempt
    if t.attempt is not None and not t.target.is_terminal:
        params["g_rank"] = progress_rank(t.target, t.attempt)
    row = statement.run(tx, params)
    if row is None:
        if tx.postgresql:
            # Refused; if only because a transaction with larger ids changed the row since
            # this one took its ids, the write runs again in a new transaction (whose ids
            # are larger), so the job's events keep the order its row went through.
            seen = current(tx, t.job_id)
            if seen is not None:
                tx.check_order(t.job_id, seen.last_event_id)
        return None
    job = Job(**row)
    append_event(tx, job, event_id, now)
    if t.target.is_terminal and t.target is not JobState.SUPERSEDED and run_is_over(tx, job):
        log_done(tx, job, now)
    if tell:
        # The outbox: each endpoint's delivery commits with the change it tells of.
        webhooks.tell_job(tx, job, t.target, now)
    return job


def current(tx: WriteTx, job_id: str, *, for_update: bool = False) -> Job | None:
    stmt = select(JOBS).where(JOBS.c.job_id == job_id)
    row = tx.execute(stmt.with_for_update() if for_update else stmt).first()
    return job_of(row) if row is not None else None


def _refused(tx: WriteTx, job_id: str) -> Applied:
    job = current(tx, job_id)
    if job is None:
        raise LookupError(f"no job {job_id}")
    return Applied(False, job.state, job.attempt, [], job.error_kind, job.error_message)


def _applied(job: Job) -> Applied:
    return Applied(
        True, job.state, job.attempt, [job.last_event_id], job.error_kind, job.error_message
    )


def _started(tx: WriteTx, job: Job, events: list[int], prompt: Prompt | None = None) -> Applied:
    """An attempt that began: the row as it stands and its prompt (read now, unless the
    transaction already did), for the call."""
    prompt = prompt if prompt is not None else _prompt_of(tx, job.prompt_id)
    return Applied(True, job.state, job.attempt, events, job=job, prompt=prompt)


def _prompt_of(tx: WriteTx, prompt_id: str) -> Prompt:
    statement = prepared(
        tx, ("prompt of job",), lambda: select(PROMPTS).where(PROMPTS.c.prompt_id == bindparam("p"))
    )
    row = statement.run(tx, {"p": prompt_id})
    assert row is not None, prompt_id
    return Prompt(**row)


def _job_row(tx: WriteTx, job_id: str) -> Job | None:
    statement = prepared(
        tx, ("job by id",), lambda: select(JOBS).where(JOBS.c.job_id == bindparam("j"))
    )
    row = statement.run(tx, {"j": job_id})
    return None if row is None else Job(**row)


def _waiting_children(tx: WriteTx, prompt_id: str) -> list[str]:
    """chain_store.waiting_children, inside the success's transaction."""
    statement = prepared(tx, ("waiting children",), lambda: waiting_children_query(bindparam("p")))
    return [row["job_id"] for row in statement.rows(tx, {"p": prompt_id})]


class Projector:
    """The one writer of job state. Every method is one transaction and safe to repeat."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        on_commit: Callable[[], None] | None = None,
        *,
        budget_window: timedelta = budgets.WINDOW,
    ) -> None:
        self.sessions = sessions
        self.on_commit = on_commit
        # The window the providers' limits count over (PROMPTJOBS_BUDGET_WINDOW_S).
        self.budget_window = budget_window
        # Shared by every writer in this process (the job store's submits too).
        self.writes = GroupCommit(sessions)

    def _committed(self, result: Applied) -> Applied:
        if result.event_ids and self.on_commit is not None:
            self.on_commit()
        return result

    async def apply(
        self,
        t: Transition,
        *,
        tail: OutputBatch | None = None,
        usage: AttemptUsage | None = None,
    ) -> Applied:
        """Apply `t`; an attempt that ends with it (a re-queue) first adds its last streamed
        text and its usage, so the transition's event carries the new sums."""

        def write(tx: WriteTx) -> Applied:
            now = utcnow()
            _end_attempt(tx, tail, usage, now)
            job = transition(tx, t, now)
            return _applied(job) if job is not None else _refused(tx, t.job_id)

        return self._committed(await self.writes.run(write))

    async def end_attempt(self, tail: OutputBatch | None, usage: AttemptUsage) -> None:
        """An attempt ended without a transition of its own (its job fails or is cancelled by
        the workflow): keep its last streamed text and record what it consumed."""

        def write(tx: WriteTx) -> bool:
            return _end_attempt(tx, tail, usage, utcnow())

        if await self.writes.run(write) and self.on_commit is not None:
            self.on_commit()

    async def append_outputs(self, batches: list[OutputBatch]) -> list[OutputWritten]:
        """Batches of streamed text, of any number of jobs, in one transaction."""

        def write(tx: WriteTx) -> list[OutputWritten]:
            now = utcnow()
            return append_outputs(tx, batches, now)

        written = await self.writes.run(write)
        if any(w.applied for w in written) and self.on_commit is not None:
            self.on_commit()
        return written

    def _room(
        self, tx: WriteTx, job_id: str, draw: Draw | None, now: datetime
    ) -> Draw | BudgetWait | budgets.Probe | None:
        """Whether the call fits its budget now (no draw: nothing to check)."""
        return None if draw is None else budgets.check(tx, job_id, draw, now, self.budget_window)

    async def start_attempt(
        self,
        job_id: str,
        attempt: int,
        worker: str,
        *,
        org_limit: int | None = None,
        draw_of: Callable[[Job, Prompt], Draw | None] | None = None,
        places: Places | None = None,
    ) -> Applied:
        """Attempt `attempt` begins. If the row still shows an earlier attempt running, that
        attempt's worker died without reporting (heartbeat timeout): record it as
        worker_crash before starting this one. With `draw_of` (what the job's call would
        draw, from the job and its prompt, read here first) the call must first fit its
        provider budget (projections/budgets.py), and takes its draw as it starts; with
        `org_limit` (the default running limit) the job must hold one of its org's slots
        (projections/admission.py). Refused either, nothing changes but the record of the
        wait, and `budget_wait` or `waiting` says why. With `places` the attempt may start at
        another of the job's places (its own one's circuit open, or its budget kept the job
        waiting past `fallback_after_s`), set on its row in the same transition (`moved` says
        where and why)."""

        def write(tx: WriteTx) -> Applied:
            now = utcnow()
            running = Transition(job_id, JobState.RUNNING, attempt, worker=worker)
            draw: Draw | None = None
            drew = probe = False
            prompt: Prompt | None = None
            moved: Moved | None = None
            reads = draw_of is not None or (places is not None and places.choosing)
            if reads and (seen := _job_row(tx, job_id)) is not None:
                prompt = _prompt_of(tx, seen.prompt_id)
                startable = seen.state is JobState.QUEUED or (
                    seen.state is JobState.RUNNING and seen.attempt < attempt
                )

                row: Job = seen

                def move(to: Moved) -> None:
                    nonlocal moved, running
                    moved, row.fallback = to, to.place
                    running = replace(running, fallback=to.place)

                if startable and places is not None and places.choosing:
                    if (at := places.at_start(tx, seen, prompt)) is not None:
                        move(at)
                draw = draw_of(seen, prompt) if startable and draw_of is not None else None
                room = self._room(tx, job_id, draw, now)
                if isinstance(room, BudgetWait) and places is not None and not room.spend:
                    waiter = budgets.waiter_of(tx, job_id)
                    waited = (now - (waiter.since if waiter else now)).total_seconds()
                    step = places.when_busy(tx, seen, prompt, waited)
                    if isinstance(step, Moved):
                        budgets.stop_waiting(tx, job_id)
                        move(step)
                        draw = draw_of(seen, prompt) if draw_of is not None else None
                        room = self._room(tx, job_id, draw, now)
                        if isinstance(room, BudgetWait) and waiter is not None:
                            # No room there either: it keeps its place in line where it was
                            # (that budget's room wakes it), and looks at the other again.
                            budgets.stop_waiting(tx, job_id)
                            budgets.wait_again(tx, waiter)
                            if step.again_s is not None:
                                by = now + timedelta(seconds=step.again_s)
                                room = budgets.ask_again_by(tx, job_id, room, by)
                    elif step is not None:
                        # Asked again when the job may move on, if the room is not there first.
                        room = budgets.ask_again_by(tx, job_id, room, now + timedelta(seconds=step))
                if isinstance(room, BudgetWait):
                    return Applied(False, seen.state, seen.attempt, budget_wait=room)
                if isinstance(room, budgets.Probe):
                    probe, room = True, room.draw
                drew = room is not None
                draw = room or draw

            def drawn() -> None:
                """The call starts: its draw is taken, its probe claimed."""
                if draw is not None and drew:
                    budgets.take(tx, job_id, attempt, draw, now, self.budget_window)
                elif draw is not None:
                    budgets.stop_waiting(tx, job_id)  # it may have waited for a probe
                if draw is not None and probe:
                    budgets.claim_probe(tx, draw.budget, now)

            if org_limit is not None and (waiting := admit(tx, job_id, org_limit, now)):
                if draw is not None:
                    budgets.stop_waiting(tx, job_id)
                seen = current(tx, job_id)
                assert seen is not None  # admit found it
                return Applied(False, seen.state, seen.attempt, waiting=waiting)
            job = transition(tx, running, now)
            if job is not None:
                drawn()
                reset_output(tx, job, now)
                started = _started(tx, job, [job.last_event_id], prompt)
                return replace(started, draw=draw, drew=drew, probing=probe, moved=moved)
            seen = current(tx, job_id)
            if seen is None:
                raise LookupError(f"no job {job_id}")
            if not (seen.state is JobState.RUNNING and seen.attempt < attempt):
                return Applied(
                    False, seen.state, seen.attempt, [], seen.error_kind, seen.error_message
                )
            crashed = Transition(
                job_id,
                JobState.QUEUED,
                attempt=seen.attempt,
                error_kind=ErrorKind.WORKER_CRASH,
                error_message=lost_attempt_message(seen.attempt, seen.worker),
                next_attempt_at=now,
            )
            lost = transition(tx, crashed, now)
            job = transition(tx, running, now)
            events = [j.last_event_id for j in (lost, job) if j is not None]
            if job is None:
                return Applied(False, *_state_of(tx, job_id), events)
            drawn()
            reset_output(tx, job, now)
            started = _started(tx, job, events, prompt)
            return replace(started, draw=draw, drew=drew, probing=probe, moved=moved)

        return self._committed(await self.writes.run(write))

    async def succeed(
        self,
        job_id: str,
        attempt: int,
        response_id: str,
        response: AttemptResult,
        *,
        tail: OutputBatch | None = None,
        usage: AttemptUsage | None = None,
    ) -> Applied:
        """Persist the response and settle the job, only if this attempt is still the job's.
        A response for a cancelled job, or from an attempt presumed dead, is discarded (its
        usage is recorded all the same: the tokens were spent). `tail` is the streamed text
        not yet written, so the output equals the response when the job succeeds."""
        settled = Transition(
            job_id, JobState.SUCCEEDED, attempt, response_id=response_id,
            require_current_attempt=True,
        )  # fmt: skip

        def write(tx: WriteTx) -> Applied:
            now = utcnow()
            _end_attempt(tx, tail, usage, now)
            job = transition(tx, settled, now, tell=False)
            if job is None:
                return _refused(tx, job_id)
            webhooks.tell_job(
                tx, job, JobState.SUCCEEDED, now, finish_reason=response.finish_reason
            )
            values = {
                "response_id": response_id,
                "job_id": job.job_id,
                "prompt_id": job.prompt_id,
                "org": job.org,
                "author": job.author,
                "attempt": attempt,
                "created_at": now,
                **response_columns(response),
            }
            statement = prepared(
                tx,
                ("insert_response",),
                # Built once per process and dialect (prepared), not at every answer.
                lambda: dialect_insert(
                    RESPONSES, postgresql=tx.postgresql
                ).on_conflict_do_nothing(),
            )
            statement.run(tx, values)
            return replace(_applied(job), waiting_children=_waiting_children(tx, job.prompt_id))

        return self._committed(await self.writes.run(write))


def _end_attempt(
    tx: WriteTx, tail: OutputBatch | None, usage: AttemptUsage | None, now: datetime
) -> bool:
    """An attempt's last text and its usage record; whether either logged an event."""
    events = tx.last_event_id
    if tail is not None:
        append_outputs(tx, [tail], now)
    if usage is not None:
        record_attempt(tx, usage, now)
    return tx.last_event_id != events


def _state_of(tx: WriteTx, job_id: str) -> tuple[JobState, int]:
    job = current(tx, job_id)
    assert job is not None, job_id
    return job.state, job.attempt


def response_columns(result: AttemptResult) -> dict[str, Any]:
    """The response row's share of an attempt's result (a subclass may carry more)."""
    return {f.name: getattr(result, f.name) for f in fields(AttemptResult)}


def share_prompts_with_archive(tx: WriteTx) -> None:
    """See `PROMPT_ARCHIVE_LOCK`."""
    if tx.postgresql:
        tx.execute(text("SELECT pg_advisory_xact_lock_shared(:key)"), {"key": PROMPT_ARCHIVE_LOCK})


def exclude_writers_of_prompts(tx: WriteTx) -> None:
    """Archive's side of `PROMPT_ARCHIVE_LOCK` (SQLite's write lock already excludes all)."""
    if tx.postgresql:
        tx.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PROMPT_ARCHIVE_LOCK})
