"""Engines and sessions for the projection store (SQLite embedded, PostgreSQL in production)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

MIGRATIONS = Path(__file__).parent / "migrations"

# The execution option `transaction()` sets on its connection: on SQLite, a write transaction
# takes the write lock at BEGIN; every other session is a reader and takes none.
WRITE = "promptjobs_write"


def async_url(url: str) -> str:
    """Accept the URLs people write (sqlite:///x.db, postgresql://...) and pick async drivers."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def sync_url(url: str) -> str:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        parsed = parsed.set(drivername="sqlite")
    elif backend == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def create_engine(url: str, *, pool_size: int = 10, busy_timeout_s: float = 30.0) -> AsyncEngine:
    if make_url(url).get_backend_name() == "sqlite":
        engine = create_async_engine(async_url(url), connect_args={"timeout": busy_timeout_s})
        _make_sqlite_transactional(engine, busy_timeout_s)
        return engine
    return create_async_engine(
        async_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
    )


def _make_sqlite_transactional(engine: AsyncEngine, busy_timeout_s: float) -> None:
    """WAL for concurrent readers; BEGIN IMMEDIATE so two writers queue instead of deadlocking.

    pysqlite's own transaction handling begins lazily and cannot upgrade a read lock safely,
    so we take over BEGIN (the recipe from SQLAlchemy's SQLite dialect documentation). Only
    `transaction()` writes, and only it takes the write lock: reads (a poll, an SSE query, the
    API key lookup of every request) begin deferred and never wait for a writer, under WAL.
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(
            "BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN"
        )


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


class WriteTurn:
    """Writers of one SQLite database take turns, across processes, in the order they ask.

    SQLite has one writer, and left to SQLite a writer that loses the race polls the lock with
    growing sleeps (its busy handler: up to 100 ms). Under load the lock then sits free while
    losers sleep, and a process that writes back to back (a busy worker) starves one that
    writes now and then (the API's submits wait seconds). So every write transaction first
    takes its process's turn (an asyncio lock) and then an advisory lock on a file beside the
    database (`flock`, which the kernel hands to a waiter as soon as it is released). Writers
    that do not take part (the sqlite3 shell, migrations) still meet in the busy handler.
    """

    def __init__(self, database: str) -> None:
        self.path = f"{database}.write-lock"
        self._fd: int | None = None
        self._local = asyncio.Lock()

    @asynccontextmanager
    async def __call__(self) -> AsyncIterator[None]:
        async with self._local:
            fd = self._open()
            acquiring = asyncio.ensure_future(asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX))
            try:
                await asyncio.shield(acquiring)
            except asyncio.CancelledError:
                # The thread still takes the lock; give it back once it has.
                acquiring.add_done_callback(lambda done: self._release_after(done, fd))
                raise
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    @staticmethod
    def _release_after(done: asyncio.Future[None], fd: int) -> None:
        if not done.cancelled() and done.exception() is None:
            fcntl.flock(fd, fcntl.LOCK_UN)


# One per SQLite engine (an engine, like its connections, lives in one event loop).
_write_turns: weakref.WeakKeyDictionary[Engine, WriteTurn] = weakref.WeakKeyDictionary()


def _write_turn(sessions: async_sessionmaker[AsyncSession]) -> AbstractAsyncContextManager[Any]:
    bind = sessions.kw.get("bind")
    if not isinstance(bind, AsyncEngine) or not is_sqlite(bind):
        return nullcontext()
    database = bind.url.database
    if not database or database == ":memory:":
        return nullcontext()
    turn = _write_turns.get(bind.sync_engine)
    if turn is None:
        turn = _write_turns[bind.sync_engine] = WriteTurn(database)
    return turn()


@asynccontextmanager
async def transaction(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """The boundary that owns the commit: commit on success, roll back on any error.
    Every write goes through here; a plain `sessions()` session is for reading."""
    async with _write_turn(sessions), sessions() as session, session.begin():
        await session.connection(execution_options={WRITE: True})
        yield session


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", sync_url(url).replace("%", "%%"))
    return config


def migrate(url: str) -> None:
    """Bring the schema to the newest migration; the embedded SQLite and PostgreSQL alike."""
    if make_url(url).get_backend_name() == "sqlite":
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), "head")


T = TypeVar("T")
Write = Callable[[AsyncSession], Awaitable[T]]


class GroupCommit:
    """Writes that queue up while one transaction is open commit together in the next.

    The projection has one writer at a time (SQLite's lock; on PostgreSQL the event-log
    lock), and under load a transaction's BEGIN, COMMIT and write turn cost as much as its
    statements. A busy worker has hundreds of attempts waiting to write; here they share
    transactions, up to `max_batch` writes or `max_hold_s` of holding the write lock, so that
    another process (the API, submitting) never waits long for its turn. Each caller returns
    once the commit that holds its write is done. If any write of a batch raises, the batch
    is rolled back and its writes are run again one transaction each, so one failure reaches
    only its own caller.
    A write whose caller gave up (cancelled) before its turn is not run; once run, it may
    commit after its caller has left, so writes must be safe to repeat (the projector's are).
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        max_batch: int = 64,
        max_hold_s: float = 0.025,
    ) -> None:
        self.sessions = sessions
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
        results: list[Any] = []
        try:
            async with transaction(self.sessions) as session:
                began = time.monotonic()
                for write, _future in batch:
                    results.append(await write(session))
                    if time.monotonic() - began >= self.max_hold_s:
                        break
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
            async with transaction(self.sessions) as session:
                result = await write(session)
        except Exception as err:
            if not future.done():
                future.set_exception(err)
            return
        if not future.done():
            future.set_result(result)
