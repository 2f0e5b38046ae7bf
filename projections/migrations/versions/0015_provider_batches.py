"""Provider batches for deferrable jobs: provider_batches, deferred_jobs, attempts.via

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "provider_batches",
        sa.Column("batch_id", sa.String(length=40), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("workflow_started", sa.Boolean(), nullable=False),
        sa.Column("provider_batch_id", sa.String(length=255), nullable=True),
        sa.Column("provider_status", sa.String(length=32), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_provider_batches")),
    )
    with op.batch_alter_table("provider_batches", schema=None) as batch_op:
        batch_op.create_index("ix_provider_batches_state", ["state", "created_at"])
        batch_op.create_index("ix_provider_batches_provider", ["provider", "created_at"])

    op.create_table(
        "deferred_jobs",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("deferred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("batch_id", sa.String(length=40), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_deferred_jobs")),
    )
    with op.batch_alter_table("deferred_jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_deferred_jobs_gather", ["batch_id", "provider", "model", "deferred_at"]
        )

    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("via", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("via")
    op.drop_table("deferred_jobs")
    op.drop_table("provider_batches")
