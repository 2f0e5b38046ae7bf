"""Event ids are never reused: job_events.id AUTOINCREMENT on SQLite

Without AUTOINCREMENT SQLite hands out max(id) + 1, so after `jobs archive` removed the newest
events, new events took ids a client's cursor had already passed. The table is rebuilt (SQLite
cannot change a key in place); its rows keep their ids and sqlite_sequence starts at the
largest. PostgreSQL's ids come from the writing transaction (projections/group_commit.py,
WriteTx) and were never reused: nothing changes there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATES = ("queued", "running", "succeeded", "failed", "cancelled", "superseded")


def job_events(autoincrement: bool) -> sa.Table:
    """job_events as 0001 to 0003 left it, with or without SQLite's AUTOINCREMENT."""
    listed = ", ".join(f"'{state}'" for state in STATES)
    return sa.Table(
        "job_events",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("prompt_id", sa.String(length=40), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column(
            "state",
            sa.Enum(*STATES, name="job_state", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(f"state IN ({listed})", name="ck_job_events_state"),
        sa.Index("ix_job_events_job_id", "job_id", "id"),
        sa.Index("ix_job_events_org_id", "org", "id"),
        sa.Index("ix_job_events_org_author_id", "org", "author", "id"),
        sa.Index("ix_job_events_prompt_id", "prompt_id", "id"),
        sqlite_autoincrement=autoincrement,
    )


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table(
        "job_events",
        recreate="always",
        copy_from=job_events(not autoincrement),
        table_kwargs={"sqlite_autoincrement": autoincrement},
    ):
        pass


def upgrade() -> None:
    _rebuild(autoincrement=True)


def downgrade() -> None:
    _rebuild(autoincrement=False)
