"""The job event log's one writer: every event, whatever its type, is appended here with the
transaction's next id (the SSE and polling cursor), and the hot statements compiled once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert

from projections.db import Prepared, WriteTx
from projections.lifecycle import EventType, JobState
from projections.models import Base, JobEvent

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


def log_event(
    tx: WriteTx,
    kind: EventType,
    *,
    job_id: str,
    prompt_id: str,
    org: str,
    author: str,
    state: JobState,
    data: dict[str, Any],
    now: datetime,
    event_id: int | None = None,
) -> int:
    """Append one event; `event_id`, when the caller already wrote it on the job row, must be
    the transaction's next id (`tx.next_event_id()`)."""
    event_id = tx.next_event_id() if event_id is None else event_id
    statement = prepared(tx, ("append_event",), lambda: insert(EVENTS))
    statement.run(
        tx,
        {
            "id": event_id,
            "type": kind.value,
            "job_id": job_id,
            "prompt_id": prompt_id,
            "org": org,
            "author": author,
            "state": state,
            "data": data,
            "created_at": now,
        },
    )
    tx.used_event_id(event_id)
    return event_id
