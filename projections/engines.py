"""Engines and sessions for the projection store (SQLite embedded, PostgreSQL in production),
and the async write transaction `transaction()` with its SQLite write turn."""

from __future__ import annotations

import asyncio
import fcntl
import os
import weakref
from collections.abc import AsyncIterator
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
    nullcontext,
)
from typing import Any

from sqlalchemy import (
    Engine,
    event,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

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
        # Sized as PostgreSQL's: past SQLAlchemy's default 5, every burst of reads opened
        # and closed overflow connections, each an aiosqlite thread and four PRAGMAs.
        engine = create_async_engine(
            async_url(url),
            connect_args={"timeout": busy_timeout_s},
            pool_size=pool_size,
            max_overflow=pool_size,
        )
        make_sqlite_transactional(engine.sync_engine, busy_timeout_s=busy_timeout_s)
        # The engine's synchronous writer (sync_writer) waits on the lock as long.
        busy_timeouts[engine.sync_engine] = busy_timeout_s
        return engine
    return create_async_engine(
        async_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
    )


def make_sqlite_transactional(
    engine: Engine, *, always_write: bool = False, busy_timeout_s: float = 30.0
) -> None:
    """WAL for concurrent readers; BEGIN IMMEDIATE so two writers queue instead of deadlocking.

    pysqlite's own transaction handling begins lazily and cannot upgrade a read lock safely,
    so we take over BEGIN (the recipe from SQLAlchemy's SQLite dialect documentation). Only
    `transaction()` writes, and only it takes the write lock: reads (a poll, an SSE query, the
    API key lookup of every request) begin deferred and never wait for a writer, under WAL.
    The synchronous writer's engine (`SyncWriter`) only writes: `always_write`.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        writes = always_write or conn.get_execution_options().get(WRITE)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


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


busy_timeouts: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()
