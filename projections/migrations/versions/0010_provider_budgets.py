"""Provider budgets: provider_budgets, budget_draws, budget_waiters, jobs.waiting_for

Requests and tokens a minute per provider and model, shared by every worker
(projections/budgets.py). No budget exists until an operator sets one or a provider's
rate-limit headers teach it, so an upgraded store runs as before.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("waiting_for", sa.Text(), nullable=True))
    op.create_table(
        "provider_budgets",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("learned_rpm", sa.Integer(), nullable=True),
        sa.Column("learned_tpm", sa.Integer(), nullable=True),
        sa.Column("paused_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("rate_limited", sa.Integer(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_provider_budgets")),
    )
    op.create_table(
        "budget_draws",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("budget", sa.String(length=200), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("drawn_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("reconciled", sa.Boolean(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_draws")),
    )
    op.create_index("ix_budget_draws_budget_at", "budget_draws", ["budget", "drawn_at"])
    op.create_index("ix_budget_draws_job", "budget_draws", ["job_id", "attempt"])
    op.create_table(
        "budget_waiters",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("budget", sa.String(length=200), nullable=False),
        sa.Column("rank", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_budget_waiters")),
    )
    op.create_index("ix_budget_waiters_budget_rank", "budget_waiters", ["budget", "rank"])


def downgrade() -> None:
    op.drop_table("budget_waiters")
    op.drop_table("budget_draws")
    op.drop_table("provider_budgets")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("waiting_for")
