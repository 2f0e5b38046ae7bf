"""Streamed output and usage: job_outputs, attempts, usage and cost on jobs and responses

Each job's current attempt's streamed text (job_outputs; every batch is also a `job.output`
event), one row per ended attempt with what it consumed (attempts), and the sums on the job
row. Jobs that ran before this migration consumed tokens nobody recorded: their usage stays 0,
their cost NULL (unknown).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("input_tokens", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("output_tokens", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("cost_usd", sa.Float(), server_default="0", nullable=True))
    # Jobs that already ran an attempt consumed what nobody recorded: unknown.
    op.execute("UPDATE jobs SET cost_usd = NULL WHERE attempt > 0")
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.add_column(sa.Column("first_token_ms", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("usage_estimated", sa.Boolean(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))
    op.create_table(
        "job_outputs",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_outputs")),
    )
    op.create_table(
        "attempts",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("usage_estimated", sa.Boolean(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("output_chars", sa.Integer(), nullable=False),
        sa.Column("first_token_ms", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_attempts")),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index("ix_attempts_org_ended", ["org", "ended_at"], unique=False)
        batch_op.create_index("ix_attempts_ended", ["ended_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_attempts_ended")
        batch_op.drop_index("ix_attempts_org_ended")
    op.drop_table("attempts")
    op.drop_table("job_outputs")
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.drop_column("cost_usd")
        batch_op.drop_column("usage_estimated")
        batch_op.drop_column("first_token_ms")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("cost_usd")
        batch_op.drop_column("output_tokens")
        batch_op.drop_column("input_tokens")
