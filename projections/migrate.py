"""The store's schema: Alembic migrations, and the checks a process makes before it uses a
store (there, migrated, reachable)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import (
    inspect,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from projections.engines import sync_url

MIGRATIONS = Path(__file__).parent / "migrations"


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
