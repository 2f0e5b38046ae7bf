"""Statements for the hot paths: `Prepared`, compiled once and run on the raw cursor, and
`VisibleHorizon`, the event id below which the log is final."""

from __future__ import annotations

from contextlib import (
    suppress,
)
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Select,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from projections.group_commit import EVENTS_PER_TRANSACTION, WriteTx


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

    def defer(self, tx: WriteTx, params: dict[str, Any]) -> None:
        """Execute with `params` at the transaction's next statement or commit, with the other
        rows deferred meanwhile (`WriteTx.defer`). For inserts nothing reads back before."""
        tx.defer(self, params)

    def _bound(self, params: dict[str, Any]) -> Any:
        values = {
            name: (process(value) if (process := self.binds.get(name)) else value)
            for name, value in (self.defaults | params).items()
        }
        return values if self.positional is None else [values[n] for n in self.positional]

    def _execute(self, tx: WriteTx, bound: list[Any], *, many: bool) -> Any:
        tx.flush()  # what was deferred goes first, in its order
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
