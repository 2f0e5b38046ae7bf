"""The projection's writes of what an attempt streamed and consumed: batches of output text
and tool calls (each one a `job.output` event), the reset when a new attempt starts, and the
attempt's usage record with the job's sums. Plain functions of a `WriteTx`, like the
projector's transitions, and as idempotent: the offset of a batch, the size of its tool
calls and the (job, attempt) of a usage record make a repeated write a no-op."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Integer, bindparam, case, insert, or_, select, update

from projections import spend
from projections.domain.lifecycle import OUTPUT_STATES, TERMINAL, EventType, JobState
from projections.event_log import append_event, log_event, log_events, prepared
from projections.group_commit import WriteTx, dialect_insert
from projections.models import AttemptRecord, Base, Job, JobOutput
from projections.rows import job_row

JOBS = Base.metadata.tables[Job.__tablename__]
OUTPUTS = Base.metadata.tables[JobOutput.__tablename__]
ATTEMPTS = Base.metadata.tables[AttemptRecord.__tablename__]


@dataclass(frozen=True)
class OutputBatch:
    """Text attempt `attempt` streamed, from character `offset` of its output on, and the
    tool calls it has streamed so far if they grew since the last batch: whole (id, name,
    the arguments' text so far), since arguments only grow, so a batch written twice or
    late never takes back what a later one wrote."""

    job_id: str
    attempt: int
    offset: int
    text: str
    tool_calls: list[dict[str, str]] | None = None


def calls_size(calls: list[dict[str, str]] | None) -> int:
    """How far tool calls have streamed: the characters of their ids, names and arguments,
    which only grow as an attempt streams (a larger size is a later snapshot)."""
    return sum(len(c["id"]) + len(c["name"]) + len(c["arguments"]) for c in calls or ())


@dataclass(frozen=True)
class OutputWritten:
    """Whether the batch landed (a repeat or a stale attempt's does not), and whether the
    attempt is still the job's running one: False tells its worker to stop the call."""

    applied: bool
    running: bool


@dataclass(frozen=True)
class AttemptUsage:
    """One attempt's record: how it ended and what it consumed (the `attempts` row)."""

    job_id: str
    attempt: int
    org: str
    outcome: str  # succeeded, cancelled or an error kind
    provider: str
    model: str
    input_tokens: int | None
    output_tokens: int | None
    usage_estimated: bool
    cost_usd: float | None
    output_chars: int
    first_token_ms: int | None
    duration_ms: int
    started_at: datetime
    ended_at: datetime
    # How the call was made where it was not one direct call (models.AttemptRecord.via).
    via: str | None = None
    # A schema miss's answer and errors (models.AttemptRecord.detail).
    detail: dict[str, Any] | None = None


def append_outputs(tx: WriteTx, batches: list[OutputBatch], now: datetime) -> list[OutputWritten]:
    """Append each batch to its job's output if it is the next text of the job's current
    attempt, and log it; whatever the number of jobs, a handful of statements: one read of
    the jobs with their output (on PostgreSQL share-locking the job rows, so no transition
    commits between the check and the append), then each kind of write in one call."""
    ids = sorted({batch.job_id for batch in batches})  # one lock order for every writer
    read = select(
        JOBS.c.job_id,
        JOBS.c.state,
        JOBS.c.attempt,
        JOBS.c.prompt_id,
        JOBS.c.org,
        JOBS.c.author,
        JOBS.c.last_event_id,
        OUTPUTS.c.attempt.label("output_attempt"),
        OUTPUTS.c.length.label("output_length"),
        OUTPUTS.c.tool_calls.label("output_calls"),
    ).select_from(JOBS.outerjoin(OUTPUTS, OUTPUTS.c.job_id == JOBS.c.job_id))
    read = read.where(JOBS.c.job_id.in_(ids))
    if tx.postgresql:
        read = read.with_for_update(read=True, of=JOBS)
    jobs = {row.job_id: SimpleNamespace(**row._mapping) for row in tx.execute(read)}
    writes: dict[str, list[dict[str, Any]]] = {"insert": [], "replace": [], "append": []}
    logged: list[tuple[Any, dict[str, Any]]] = []
    results = []
    for batch in batches:
        job = jobs.get(batch.job_id)
        if job is None:
            results.append(OutputWritten(False, False))
            continue
        running = job.state is JobState.RUNNING and job.attempt == batch.attempt
        placed = _place(job, batch)
        if placed is None:
            results.append(OutputWritten(False, running))
            continue
        # Its event after the row's last transition's (see projector.transition).
        tx.check_order(job.job_id, job.last_event_id)
        how, batch = placed
        kept = job.output_calls if how == "append" else None
        calls = batch.tool_calls if batch.tool_calls is not None else kept
        writes[how].append(
            {
                "job_id": batch.job_id,
                "attempt": batch.attempt,
                "text": batch.text,
                "length": len(batch.text),
                "tool_calls": calls,
                "now": now,
            }
        )
        # The next batch of the same job (a later flush in one transaction) goes on from here.
        job.output_attempt, job.output_length = batch.attempt, batch.offset + len(batch.text)
        job.output_calls = calls
        data: dict[str, Any] = {
            "job_id": batch.job_id,
            "attempt": batch.attempt,
            "offset": batch.offset,
            "text": batch.text,
        }
        if batch.tool_calls is not None:
            data["tool_calls"] = batch.tool_calls
        logged.append((job, data))
        results.append(OutputWritten(True, running))
    for how, build in (
        ("insert", _insert_statement),
        ("replace", _replace_statement),
        ("append", _append_statement),
    ):
        prepared(tx, (f"{how}_output",), build).run_many(tx, writes[how])
    log_events(tx, EventType.OUTPUT, logged, now)
    return results


def _place(job: Any, batch: OutputBatch) -> tuple[str, OutputBatch] | None:
    """How `batch` joins the job's stored output: ("insert" | "replace" | "append", the
    batch as written: its new text, and its tool calls if they are newer than the stored
    ones), or None if it does not belong (a stale attempt, a settled job, text and calls
    already stored, or a gap in the text)."""
    if job.attempt != batch.attempt or job.state not in OUTPUT_STATES:
        return None
    same = job.output_attempt == batch.attempt
    stored = calls_size(job.output_calls) if same else 0
    calls = batch.tool_calls if calls_size(batch.tool_calls) > stored else None
    if not batch.text and calls is None:
        return None
    if job.output_attempt is None or job.output_attempt < batch.attempt:
        # The attempt's first output (replacing an earlier attempt's that streamed nothing
        # more, when no reset was due).
        how = "insert" if job.output_attempt is None else "replace"
        return (how, replace(batch, tool_calls=calls)) if batch.offset == 0 else None
    have = job.output_length
    if same and batch.offset <= have < batch.offset + len(batch.text):
        # The batch goes on from where the text ends; a batch that starts earlier repeats
        # text a write whose commit went unacknowledged already stored: only its rest goes.
        rest = batch.text[have - batch.offset :]
        return "append", OutputBatch(batch.job_id, batch.attempt, have, rest, calls)
    if same and calls is not None:
        return "append", OutputBatch(batch.job_id, batch.attempt, have, "", calls)
    return None


def _insert_statement() -> Any:
    return insert(OUTPUTS).values(
        job_id=bindparam("job_id", None),
        attempt=bindparam("attempt", None),
        text=bindparam("text", None),
        length=bindparam("length", None),
        tool_calls=bindparam("tool_calls", None, type_=OUTPUTS.c.tool_calls.type),
        updated_at=bindparam("now", None, type_=OUTPUTS.c.updated_at.type),
    )


def _replace_statement() -> Any:
    return (
        update(OUTPUTS)
        .where(OUTPUTS.c.job_id == bindparam("job_id", None))
        .values(
            attempt=bindparam("attempt", None),
            text=bindparam("text", None),
            length=bindparam("length", None),
            tool_calls=bindparam("tool_calls", None, type_=OUTPUTS.c.tool_calls.type),
            updated_at=bindparam("now", None, type_=OUTPUTS.c.updated_at.type),
        )
    )


def _append_statement() -> Any:
    return (
        update(OUTPUTS)
        .where(OUTPUTS.c.job_id == bindparam("job_id", None))
        .values(
            text=OUTPUTS.c.text + bindparam("text", None, type_=OUTPUTS.c.text.type),
            length=OUTPUTS.c.length + bindparam("length", None, type_=OUTPUTS.c.length.type),
            tool_calls=bindparam("tool_calls", None, type_=OUTPUTS.c.tool_calls.type),
            updated_at=bindparam("now", None, type_=OUTPUTS.c.updated_at.type),
        )
    )


def reset_output(tx: WriteTx, job: Job, now: datetime) -> None:
    """Attempt `job.attempt` has just started: if an earlier attempt streamed text or tool
    calls, clear them and log a `job.output_reset`, so no client glues two attempts'
    output together."""
    statement = prepared(tx, ("reset_output",), _reset_statement)
    cleared = statement.run(tx, {"job_id": job.job_id, "attempt": job.attempt, "now": now})
    if cleared is None:
        return
    data = {"job_id": job.job_id, "attempt": job.attempt}
    log_event(tx, EventType.OUTPUT_RESET, job, data, now)


def _reset_statement() -> Any:
    attempt = bindparam("attempt", None, type_=OUTPUTS.c.attempt.type)
    return (
        update(OUTPUTS)
        .where(
            OUTPUTS.c.job_id == bindparam("job_id", None),
            OUTPUTS.c.attempt < attempt,
            or_(OUTPUTS.c.length > 0, OUTPUTS.c.tool_calls.is_not(None)),
        )
        .values(
            attempt=attempt,
            text="",
            length=0,
            tool_calls=None,
            updated_at=bindparam("now", None, type_=OUTPUTS.c.updated_at.type),
        )
        .returning(OUTPUTS.c.job_id)
    )


def _record_statement(postgresql: bool) -> Any:
    insert_attempt = dialect_insert(ATTEMPTS, postgresql=postgresql)
    return insert_attempt.on_conflict_do_nothing().returning(ATTEMPTS.c.job_id)


def _add_usage_statement() -> Any:
    settled = JOBS.c.state.in_(TERMINAL)
    event_id = bindparam("event_id", None, type_=JOBS.c.last_event_id.type)
    return (
        update(JOBS)
        .where(
            JOBS.c.job_id == bindparam("job_id", None),
            # A settled row's event must come after its last (see projector.transition).
            or_(~settled, JOBS.c.last_event_id < event_id),
        )
        .values(
            input_tokens=JOBS.c.input_tokens + bindparam("input_tokens", None, type_=Integer()),
            output_tokens=JOBS.c.output_tokens + bindparam("output_tokens", None, type_=Integer()),
            # NULL (unknown) stays NULL once any attempt's cost is unknown.
            cost_usd=JOBS.c.cost_usd + bindparam("cost", None, type_=JOBS.c.cost_usd.type),
            # A settled row's change is an event of its own (job.usage).
            last_event_id=case((settled, event_id), else_=JOBS.c.last_event_id),
        )
        .returning(*JOBS.c)
    )


def record_attempt(tx: WriteTx, usage: AttemptUsage, now: datetime) -> Job | None:
    """Record the attempt once and add what it consumed to the job's sums: the job row after,
    or None if the attempt was recorded before. A job that has already settled (a cancelled
    call's last tokens come after the cancel) gets a `job.usage` event with the new sums;
    otherwise the next transition's event carries them."""
    record = prepared(tx, ("record_attempt",), lambda: _record_statement(tx.postgresql))
    # What the call held under a spend cap gives way to what it cost, in this transaction.
    release = prepared(tx, ("release_spend_hold",), spend.release_statement)
    release.run(tx, {"job_id": usage.job_id, "attempt": usage.attempt})
    if record.run(tx, asdict(usage)) is None:
        return None
    event_id = tx.next_event_id()
    add = prepared(tx, ("add_usage",), _add_usage_statement)
    row = add.run(
        tx,
        {
            "job_id": usage.job_id,
            "input_tokens": usage.input_tokens or 0,
            "output_tokens": usage.output_tokens or 0,
            "cost": usage.cost_usd,
            "event_id": event_id,
        },
    )
    if row is None:
        if tx.postgresql:
            last = select(JOBS.c.last_event_id).where(JOBS.c.job_id == usage.job_id)
            seen = tx.execute(last).scalar()
            if seen is not None:
                tx.check_order(usage.job_id, seen)
        return None
    job = Job(**row)
    if job.state in TERMINAL:
        append_event(tx, job, event_id, now, EventType.USAGE)
        if usage.attempt == job.attempt:
            log_done(tx, job, now)
    return job


def run_is_over(tx: WriteTx, job: Job) -> bool:
    """Whether a job that has just settled has all of its record: it never started an
    attempt, or its last attempt's usage (written with its last text) is in. Otherwise that
    attempt is still ending (a cancelled call) and `record_attempt` logs the end."""
    if job.attempt == 0:
        return True
    recorded = prepared(
        tx,
        ("attempt recorded",),
        lambda: select(ATTEMPTS.c.attempt).where(
            ATTEMPTS.c.job_id == bindparam("job_id"), ATTEMPTS.c.attempt == bindparam("attempt")
        ),
    )
    return recorded.run(tx, {"job_id": job.job_id, "attempt": job.attempt}) is not None


def log_done(tx: WriteTx, job: Job, now: datetime) -> None:
    """Log `job.done`: the job's stream is complete (EventType.DONE)."""
    log_event(tx, EventType.DONE, job, job_row(job), now)
