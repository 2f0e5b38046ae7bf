"""The job event log's one writer: every event, whatever its type, is appended here with the
transaction's next id (the SSE and polling cursor), and the hot statements compiled once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import insert

from projections import metrics
from projections.domain.lifecycle import EventType, JobState
from projections.group_commit import WriteTx
from projections.metrics import transition_labels
from projections.models import Base, Job, JobEvent
from projections.prepared import Prepared
from projections.rows import job_row

EVENTS = Base.metadata.tables[JobEvent.__tablename__]


def utcnow() -> datetime:
    return datetime.now(UTC)


_prepared: dict[tuple[Any, ...], Prepared] = {}


def prepared(tx: WriteTx, key: tuple[Any, ...], build: Callable[[], Any]) -> Prepared:
    """The statement `build` makes, compiled once per dialect and `key`."""
    full = (tx.conn.dialect.name, *key)
    found = _prepared.get(full)
    if found is None:
        found = _prepared[full] = Prepared(build(), tx.conn.dialect)
    return found


class Logged(Protocol):
    """What an event records of its job (a Job, or a row read with these columns)."""

    job_id: str
    prompt_id: str
    org: str
    author: str
    state: JobState


def log_event(
    tx: WriteTx,
    kind: EventType,
    job: Logged,
    data: dict[str, Any],
    now: datetime,
    event_id: int | None = None,
    *,
    defer: bool = False,
) -> int:
    """Append one event of `job`; `event_id`, when the caller already wrote it on the job
    row, must be the transaction's next id (`tx.next_event_id()`)."""
    row = _event_row(tx, kind, job, data, now, event_id)
    statement = prepared(tx, ("append_event",), lambda: insert(EVENTS))
    if defer:
        statement.defer(tx, row)
    else:
        statement.run(tx, row)
    return int(row["id"])


def log_events(
    tx: WriteTx, kind: EventType, events: list[tuple[Logged, dict[str, Any]]], now: datetime
) -> None:
    """Append many events of one kind in one call, with the transaction's next ids in order."""
    rows = [_event_row(tx, kind, job, data, now) for job, data in events]
    prepared(tx, ("append_event",), lambda: insert(EVENTS)).run_many(tx, rows)


def _event_row(
    tx: WriteTx,
    kind: EventType,
    job: Logged,
    data: dict[str, Any],
    now: datetime,
    event_id: int | None = None,
) -> dict[str, Any]:
    """The event's row, taking the transaction's next id (or `event_id`, which must be it)."""
    event_id = tx.next_event_id() if event_id is None else event_id
    tx.used_event_id(event_id)
    return {
        "id": event_id,
        "type": kind.value,
        "job_id": job.job_id,
        "prompt_id": job.prompt_id,
        "org": job.org,
        "author": job.author,
        "state": job.state,
        "data": data,
        "created_at": now,
    }


def append_event(
    tx: WriteTx,
    job: Job,
    event_id: int,
    now: datetime,
    kind: EventType = EventType.STATE_CHANGED,
    *,
    defer: bool = False,
) -> int:
    """Log the row as it now stands (a transition, or new usage sums); `event_id` is already
    the row's last_event_id. `defer`: the event's row goes with the transaction's next
    statement or its commit (`WriteTx.defer`)."""
    log_event(tx, kind, job, job_row(job), now, event_id, defer=defer)
    if kind is EventType.STATE_CHANGED:
        state, error_kind = transition_labels(job.state, job.error_kind)
        counter = metrics.TRANSITIONS.labels(state=state, error_kind=error_kind)
        tx.after_commit.append(counter.inc)
    return event_id
