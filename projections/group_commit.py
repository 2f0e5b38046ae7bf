"""The projection's write path: every write is a function of a `WriteTx`, run by
`GroupCommit`, which commits the writes that queued up meanwhile together in one
transaction on a synchronous writer (`SyncWriter`)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import (
    AbstractContextManager,
    contextmanager,
    nullcontext,
)
from typing import Any, Protocol, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    Executable,
    Table,
    text,
)
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
)

from projections.engines import busy_timeouts, make_sqlite_transactional, sync_url
from projections.notifications import EVENTS_CHANNEL

T = TypeVar("T")
Write = Callable[["WriteTx"], T]

# PostgreSQL event ids are (writing transaction's id << 20) + the event's number within it:
# ordered by transaction first, so a reader that only returns events of transactions older
# than every one still in flight never skips one (docs/decisions.md, "The event cursor").
EVENTS_PER_TRANSACTION = 1 << 20


class EventIdBehind(Exception):
    """A job's row already holds an event id above the one this transaction would log next:
    another transaction, whose id is larger (PostgreSQL: it began writing later), committed
    a change of the job since this one took its ids. Logging now would put the job's events
    out of the order its row went through them; the write is run again in a new transaction,
    whose ids come after every id committed so far."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} changed in a later transaction; write again")
        self.job_id = job_id


# A write refused as EventIdBehind is run again this many times, each in a new transaction.
BEHIND_RETRIES = 5


def dialect_insert(table: Table, *, postgresql: bool) -> pg.Insert | sqlite.Insert:
    """An INSERT in the database's own dialect: the one that can say what a conflict does
    (`on_conflict_do_nothing`, `on_conflict_do_update`)."""
    return pg.insert(table) if postgresql else sqlite.insert(table)


class WriteTx:
    """One write transaction on a synchronous connection, run inside one thread hop.

    Writes are plain functions of it (no awaits): a transition is a guarded UPDATE and an
    INSERT, so a transaction costs one hop to a thread, not one per statement. It hands out
    event ids (see `EVENTS_PER_TRANSACTION`) and collects what to do once it commits."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.postgresql = conn.dialect.name == "postgresql"
        # Run once the transaction has committed (a rolled-back one never runs them).
        self.after_commit: list[Callable[[], None]] = []
        self._next_event_id: int | None = None
        self.last_event_id: int | None = None
        # Inserts whose rows nothing reads back in this transaction, by statement, in the
        # order each statement was first deferred: sent together before the next statement
        # and before the commit, one multi-row call per statement (`flush`).
        self._deferred: dict[int, tuple[Deferrable, list[dict[str, Any]]]] = {}

    def execute(self, statement: Executable, params: dict[str, Any] | None = None) -> Any:
        self.flush()
        return self.conn.execute(statement, params)

    def defer(self, statement: Deferrable, params: dict[str, Any]) -> None:
        """Insert a row with `statement` at the next flush: a group commit's submits send
        their prompts, jobs and events in three calls, not three round trips each."""
        self._deferred.setdefault(id(statement), (statement, []))[1].append(params)

    def flush(self) -> None:
        """Send the deferred inserts, each statement's rows in one call, in the order the
        statements were first deferred (a prompt before its job, a job before its event)."""
        pending, self._deferred = self._deferred, {}
        for statement, rows in pending.values():
            statement.run_many(self, rows)

    def next_event_id(self) -> int:
        """The id the transaction's next event gets (taken by `used_event_id`)."""
        if self._next_event_id is None:
            self._next_event_id = self._first_event_id()
        return self._next_event_id

    def check_order(self, job_id: str, row_event_id: int) -> None:
        """Raise EventIdBehind unless this transaction's next event id comes after the job
        row's (read under the row's lock)."""
        if row_event_id >= self.next_event_id():
            raise EventIdBehind(job_id)

    def used_event_id(self, event_id: int) -> None:
        assert event_id == self._next_event_id, "event ids are taken in order"
        self.last_event_id = event_id
        self._next_event_id = event_id + 1

    def _first_event_id(self) -> int:
        if self.postgresql:
            xid = self.conn.exec_driver_sql("SELECT pg_current_xact_id()::text::bigint").scalar()
            return int(xid or 0) * EVENTS_PER_TRANSACTION + 1
        # SQLite: this transaction holds the write lock, so the next id is the log's next one;
        # AUTOINCREMENT keeps the high-water mark even when the newest events are archived.
        seq = self.conn.exec_driver_sql(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'job_events'), 0),"
            " coalesce((SELECT max(id) FROM job_events), 0))"
        ).scalar()
        return int(seq or 0) + 1


class Deferrable(Protocol):
    """A statement a transaction can send many rows of at once (prepared.Prepared)."""

    def run_many(self, tx: WriteTx, params: list[dict[str, Any]]) -> None: ...


class SyncWriteTurn:
    """The synchronous writers' share of `WriteTurn`: one at a time in the process (a thread
    lock), then the same `flock` beside the database, held only for the transaction."""

    def __init__(self, database: str) -> None:
        self.path = f"{database}.write-lock"
        self._local = threading.Lock()
        self._fd: int | None = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._local:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)


class SyncWriter:
    """The synchronous engine the projection's writes run on, beside the async one that reads."""

    def __init__(self, url: str, *, pool_size: int = 2, busy_timeout_s: float = 30.0) -> None:
        self.sqlite = make_url(url).get_backend_name() == "sqlite"
        self.turn: Callable[[], AbstractContextManager[Any]] = nullcontext
        if self.sqlite:
            self.engine = sa_create_engine(
                sync_url(url),
                connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
            )
            make_sqlite_transactional(self.engine, always_write=True, busy_timeout_s=busy_timeout_s)
            database = make_url(url).database
            if database and database != ":memory:":
                self.turn = SyncWriteTurn(database)
        else:
            self.engine = sa_create_engine(
                sync_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
            )

    def run(self, writes: list[Write[Any]], max_hold_s: float | None = None) -> list[Any]:
        """Run `writes` in one transaction, in order, and commit: their results. With
        `max_hold_s`, stop taking writes once the transaction has been open that long (the
        results are then fewer than the writes). Raises, committing nothing, if one raises."""
        results: list[Any] = []
        with self.turn(), self.engine.connect() as conn:
            with conn.begin():
                tx = WriteTx(conn)
                began = time.monotonic()
                for write in writes:
                    results.append(write(tx))
                    if max_hold_s is not None and time.monotonic() - began >= max_hold_s:
                        break
                tx.flush()
                if tx.postgresql and tx.last_event_id is not None:
                    # Delivered at commit to API processes that wake their SSE streams on it.
                    conn.execute(
                        text("SELECT pg_notify(:channel, :payload)"),
                        {"channel": EVENTS_CHANNEL, "payload": str(tx.last_event_id)},
                    )
        for hook in tx.after_commit:
            hook()
        return results

    def dispose(self) -> None:
        self.engine.dispose()


# One per async engine, so every GroupCommit of a process shares its pool and write turn.
_writers: weakref.WeakKeyDictionary[Engine, SyncWriter] = weakref.WeakKeyDictionary()


def sync_writer(sessions: async_sessionmaker[AsyncSession]) -> SyncWriter:
    bind = sessions.kw.get("bind")
    assert isinstance(bind, AsyncEngine), "a session factory bound to one engine"
    writer = _writers.get(bind.sync_engine)
    if writer is None:
        url = bind.url.render_as_string(hide_password=False)
        busy_timeout_s = busy_timeouts.get(bind.sync_engine, 30.0)
        writer = _writers[bind.sync_engine] = SyncWriter(url, busy_timeout_s=busy_timeout_s)
    return writer


async def dispose(engine: AsyncEngine) -> None:
    """Close the engine's pools: its own and its synchronous writer's."""
    writer = _writers.pop(engine.sync_engine, None)
    if writer is not None:
        writer.dispose()
    await engine.dispose()


class GroupCommit:
    """Writes that queue up while one transaction is open commit together in the next.

    SQLite has one writer at a time, and under load a transaction's BEGIN, COMMIT and write
    turn cost as much as its statements; on PostgreSQL a commit is a WAL flush. A busy worker
    has hundreds of attempts waiting to write; here they share transactions, up to
    `max_batch` writes or `max_hold_s` of holding the write lock, so that another process
    (the API, submitting) never waits long for its turn. Each batch is one hop to a thread
    running it on a synchronous connection (`SyncWriter.run`). Each caller returns once the
    commit that holds its write is done. If any write of a batch raises, the batch is rolled
    back and its writes are run again one transaction each, so one failure reaches only its
    own caller.
    A write whose caller gave up (cancelled) before its turn is not run; once run, it may
    commit after its caller has left, so writes must be safe to repeat (the projector's are).
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        max_batch: int = 64,
        max_hold_s: float = 0.025,
    ) -> None:
        self.writer = sync_writer(sessions)
        self.max_batch = max_batch
        self.max_hold_s = max_hold_s
        self._queue: list[tuple[Write[Any], asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def run(self, write: Write[T]) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append((write, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        batch: list[tuple[Write[Any], asyncio.Future[Any]]] = []
        try:
            while self._queue:
                batch = [item for item in self._queue[: self.max_batch] if not item[1].done()]
                del self._queue[: self.max_batch]
                if len(batch) > 1:
                    committed = await self._together(batch)
                    if committed is not None:
                        # The writes the time budget left out go first in the next one.
                        self._queue[:0] = batch[committed:]
                        continue
                for write, future in batch:
                    await self._alone(write, future)
        finally:
            # Cancelled (the process is stopping): no caller is left waiting for ever.
            for _write, future in batch + self._queue:
                future.cancel()

    async def _together(self, batch: list[tuple[Write[Any], asyncio.Future[Any]]]) -> int | None:
        """Commit the batch's first writes in one transaction: how many, or None if one
        raised (and nothing was committed)."""
        try:
            results = await asyncio.to_thread(
                self.writer.run, [write for write, _ in batch], self.max_hold_s
            )
        except Exception:
            return None  # run them one by one: only the failing write's caller hears of it
        for (_write, future), result in zip(batch, results, strict=False):
            if not future.done():
                future.set_result(result)
        return len(results)

    async def _alone(self, write: Write[Any], future: asyncio.Future[Any]) -> None:
        if future.done():
            return
        try:
            for tries_left in range(BEHIND_RETRIES, -1, -1):
                try:
                    [result] = await asyncio.to_thread(self.writer.run, [write])
                    break
                except EventIdBehind:
                    if not tries_left:
                        raise
        except Exception as err:
            if not future.done():
                future.set_exception(err)
            return
        if not future.done():
            future.set_result(result)
