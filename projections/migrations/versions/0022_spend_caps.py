"""Spend caps: an org's and a key's US dollars a day, held by each call as it starts

Jobs submitted before record no key: only their org's cap applies to them.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("org_limits", schema=None) as batch_op:
        batch_op.add_column(sa.Column("usd_per_day", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("over_cap", sa.String(length=8), nullable=True))
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("usd_per_day", sa.Float(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key_id", sa.String(length=32), nullable=True))
    op.create_table(
        "spend_holds",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=True),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("held_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_spend_holds")),
    )
    op.create_index("ix_spend_holds_org_held", "spend_holds", ["org", "held_at"])
    op.create_index("ix_spend_holds_key_held", "spend_holds", ["key_id", "held_at"])
    op.create_table(
        "spend_waiters",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("cap", sa.String(length=100), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_spend_waiters")),
    )
    op.create_index("ix_spend_waiters_cap_since", "spend_waiters", ["cap", "since"])


def downgrade() -> None:
    op.drop_table("spend_waiters")
    op.drop_table("spend_holds")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("key_id")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("usd_per_day")
    with op.batch_alter_table("org_limits", schema=None) as batch_op:
        batch_op.drop_column("over_cap")
        batch_op.drop_column("usd_per_day")
