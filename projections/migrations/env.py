"""Alembic environment: runs the projection's migrations against the configured URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from projections.models import Base

config = context.config
target_metadata = Base.metadata
# pg_advisory_xact_lock key of schema migrations (the event log's lock is another key).
LOCK = 7215002


def run_migrations() -> None:
    url = config.get_main_option("sqlalchemy.url")
    assert url is not None
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # Every API and worker process migrates at start-up, and `docker compose up
                # --scale worker=4` starts them together: one migrates, the others wait here
                # and then find the schema at head. The lock ends with the transaction.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK})
            context.run_migrations()


run_migrations()
