"""Engines and sessions for the projection store (SQLite embedded, PostgreSQL in production).
The async engine reads; every write goes through projections/group_commit.py."""

from __future__ import annotations

import weakref
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
    so we take over BEGIN (the recipe from SQLAlchemy's SQLite dialect documentation). Every
    write runs on the synchronous writer's engine (projections/group_commit.py `SyncWriter`),
    which only writes (`always_write`: BEGIN IMMEDIATE); the async engine only reads (a
    poll, an SSE query, the API key lookup of every request): its transactions begin
    deferred and never wait for a writer, under WAL.
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
        conn.exec_driver_sql("BEGIN IMMEDIATE" if always_write else "BEGIN")


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


busy_timeouts: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()
