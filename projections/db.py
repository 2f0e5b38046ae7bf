"""Engines and sessions for the projection store (SQLite embedded, PostgreSQL in production)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
    suppress,
)
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Executable,
    Float,
    Select,
    event,
    inspect,
    text,
)
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from projections.notifications import EVENTS_CHANNEL

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
        # Sized as PostgreSQL's: past SQLAlchemy's default 5, every burst of reads opened
        # and closed overflow connections, each an aiosqlite thread and four PRAGMAs.
        engine = create_async_engine(
            async_url(url),
            connect_args={"timeout": busy_timeout_s},
            pool_size=pool_size,
            max_overflow=pool_size,
        )
        _make_sqlite_transactional(engine.sync_engine, busy_timeout_s=busy_timeout_s)
        # The engine's synchronous writer (sync_writer) waits on the lock as long.
        _busy_timeouts[engine.sync_engine] = busy_timeout_s
        return engine
    return create_async_engine(
        async_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
    )


def _make_sqlite_transactional(
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
            # `promptjobs api` and `worker` started together on a new database: one migrates,
            # the others wait here and find the schema at head (PostgreSQL: env.py's lock).
            fd = os.open(f"{database}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                command.upgrade(alembic_config(url), "head")
            finally:
                os.close(fd)  # releases the lock
            return
    command.upgrade(alembic_config(url), "head")


class StoreUnavailable(Exception):
    """The projection store a command was pointed at is not there, is not a promptjobs
    store, or does not answer. The message says which, and what to set."""


STORE_HINT = (
    "start `promptjobs dev` (or `api`/`worker`) on it first, or point PROMPTJOBS_DATA_DIR "
    "or PROMPTJOBS_DATABASE_URL at the store your service uses"
)


def database_error(err: DBAPIError) -> str:
    """What the database driver said, in one line (its first), for an error message."""
    said = str(err.orig) if err.orig else str(err)
    return (said.strip().splitlines() or [type(err).__name__])[0]


def store_url(url: str) -> URL:
    """`url` parsed, if it names a store we can use (SQLite or PostgreSQL), else
    StoreUnavailable saying what a URL should look like."""
    try:
        parsed = make_url(url)
    except ArgumentError as err:
        raise StoreUnavailable(
            f"the database URL {url!r} is not one (PROMPTJOBS_DATABASE_URL or DATABASE_URL): "
            "expected postgresql://user@host:port/database or sqlite:///path/to/promptjobs.db"
        ) from err
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        shown = parsed.render_as_string(hide_password=True)
        raise StoreUnavailable(
            f"the database URL {shown} is neither PostgreSQL nor SQLite "
            "(PROMPTJOBS_DATABASE_URL or DATABASE_URL)"
        )
    return parsed


def migrate_store(url: str) -> None:
    """`migrate`, with a store that cannot be used said in one StoreUnavailable line."""
    shown = store_url(url).render_as_string(hide_password=True)
    try:
        migrate(url)
    except DBAPIError as err:
        raise StoreUnavailable(
            f"cannot use the database at {shown}: {database_error(err)}"
        ) from err
    except OSError as err:
        raise StoreUnavailable(f"cannot use the database at {shown}: {err}") from err


def require_store(url: str) -> None:
    """Raise StoreUnavailable unless `url` names a store whose schema a promptjobs service
    has created. Never creates one: an operator's command pointed at the wrong place says
    so rather than showing an empty world."""
    parsed = store_url(url)
    shown = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if not database or database == ":memory:" or not Path(database).is_file():
            raise StoreUnavailable(f"no promptjobs store at {database or shown}: {STORE_HINT}")
        url = f"sqlite:///file:{Path(database).resolve()}?mode=ro&uri=true"
    engine = sa_create_engine(
        sync_url(url), connect_args={} if backend == "sqlite" else {"connect_timeout": 5}
    )
    try:
        with engine.connect() as conn:
            found = inspect(conn).has_table("alembic_version")
    except DBAPIError as err:
        raise StoreUnavailable(
            f"cannot use the database at {shown}: {database_error(err)}"
        ) from err
    finally:
        engine.dispose()
    if not found:
        raise StoreUnavailable(f"no promptjobs store in {shown} (no schema): {STORE_HINT}")


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

    def execute(self, statement: Executable, params: dict[str, Any] | None = None) -> Any:
        return self.conn.execute(statement, params)

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
            _make_sqlite_transactional(
                self.engine, always_write=True, busy_timeout_s=busy_timeout_s
            )
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


_busy_timeouts: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()


def sync_writer(sessions: async_sessionmaker[AsyncSession]) -> SyncWriter:
    bind = sessions.kw.get("bind")
    assert isinstance(bind, AsyncEngine), "a session factory bound to one engine"
    writer = _writers.get(bind.sync_engine)
    if writer is None:
        url = bind.url.render_as_string(hide_password=False)
        busy_timeout_s = _busy_timeouts.get(bind.sync_engine, 30.0)
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


class VisibleHorizon(FunctionElement[int]):
    """Event ids below this are final: every transaction that could still add one below it
    has ended. On PostgreSQL that is (the oldest transaction still in flight << 20), since an
    event's id starts with its transaction's id (`EVENTS_PER_TRANSACTION`); SQLite commits
    ids in order (one writer), so every committed id is final."""

    type = BigInteger()
    inherit_cache = True
    name = "visible_horizon"


@compiles(VisibleHorizon)
def _horizon_anywhere(element: VisibleHorizon, compiler: Any, **kw: Any) -> str:
    return str(2**63 - 1)


@compiles(VisibleHorizon, "postgresql")
def _horizon_postgresql(element: VisibleHorizon, compiler: Any, **kw: Any) -> str:
    # pg_current_snapshot() is the statement's own snapshot: what it sees below the horizon
    # is everything there will ever be below it.
    return f"(pg_snapshot_xmin(pg_current_snapshot())::text::bigint * {EVENTS_PER_TRANSACTION})"


# PostgreSQL's type code of double precision: psycopg's float result processor asks which
# floating type a column is (SQLAlchemy passes the cursor's; a prepared statement has none).
PG_FLOAT8 = 701


def _coltype(column: Any, dialect: Any) -> int | None:
    if dialect.name == "postgresql" and isinstance(column.type, Float):
        return PG_FLOAT8
    return None


class Prepared:
    """A statement compiled once for a dialect and then run on the raw DBAPI cursor.

    SQLAlchemy's per-execution work (cache key, execution context, result rows) costs ten
    times what SQLite spends on a small UPDATE; the projector's hot statements skip it. The
    columns' own type processors still convert every value both ways, so what is stored is
    exactly what SQLAlchemy would store."""

    def __init__(self, statement: Any, dialect: Any) -> None:
        compiled = statement.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
        self.sql: str = compiled.string
        # Literals of the statement (a rank's constant, the states of an IN list) keep the
        # values they were compiled with; every other bind is given at each run.
        self.defaults: dict[str, Any] = dict(compiled.params)
        names = list(compiled.positiontup or [])
        self.positional = names if dialect.paramstyle in ("qmark", "format", "numeric") else None
        self.binds = {
            name: bind.type._cached_bind_processor(dialect) for name, bind in compiled.binds.items()
        }
        # The row it gives back: a RETURNING clause's columns, or a SELECT's.
        columns = getattr(statement, "_returning", ()) or (
            statement.selected_columns if isinstance(statement, Select) else ()
        )
        self.returning = [
            (
                str(column.key),
                column.type._cached_result_processor(dialect, _coltype(column, dialect)),
            )
            for column in columns
        ]

    def run(self, tx: WriteTx, params: dict[str, Any]) -> dict[str, Any] | None:
        """Execute with `params` (bind names to values); the returned row as a dict, if any."""
        rows = self._execute(tx, [self._bound(params)], many=False)
        return self._row(rows[0]) if rows else None

    def rows(self, tx: WriteTx, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Execute with `params`; every row it gives back, as dicts."""
        return [self._row(row) for row in self._execute(tx, [self._bound(params)], many=False)]

    def _row(self, row: Any) -> dict[str, Any]:
        return {
            key: (process(value) if process else value)
            for (key, process), value in zip(self.returning, row, strict=True)
        }

    def run_many(self, tx: WriteTx, params: list[dict[str, Any]]) -> None:
        """Execute once per parameter set, in one call (psycopg pipelines it: one round
        trip, not one per row). For statements that return nothing."""
        if params:
            self._execute(tx, [self._bound(p) for p in params], many=True)

    def _bound(self, params: dict[str, Any]) -> Any:
        values = {
            name: (process(value) if (process := self.binds.get(name)) else value)
            for name, value in (self.defaults | params).items()
        }
        return values if self.positional is None else [values[n] for n in self.positional]

    def _execute(self, tx: WriteTx, bound: list[Any], *, many: bool) -> Any:
        dbapi_connection: Any = tx.conn.connection.dbapi_connection
        cursor = dbapi_connection.cursor()
        dialect = tx.conn.dialect
        try:
            if many:
                cursor.executemany(self.sql, bound)
                return None
            cursor.execute(self.sql, bound[0])
            return cursor.fetchall() if self.returning else None
        except dialect.loaded_dbapi.Error as err:
            # As SQLAlchemy's own execute raises it: IntegrityError, OperationalError, … with
            # a dropped connection marked invalidated (and dropped from the pool).
            gone = dialect.is_disconnect(err, dbapi_connection, cursor)
            if gone:
                tx.conn.invalidate(err)
            raise DBAPIError.instance(
                self.sql,
                bound,
                err,
                dialect.loaded_dbapi.Error,
                connection_invalidated=gone,
                dialect=dialect,
            ) from err
        finally:
            with suppress(dialect.loaded_dbapi.Error):
                cursor.close()
