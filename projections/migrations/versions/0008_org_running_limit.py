"""Each org's running limit: jobs.admitted_at, jobs.awaiting_slot_since, org_limits

A job takes one of its org's slots at its first attempt's start and holds it until it settles
(projections/admission.py). Jobs already in flight hold theirs: their rows are marked admitted
from when their workflow started.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("awaiting_slot_since", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.create_index("ix_jobs_awaiting_slot", ["awaiting_slot_since"], unique=False)
    op.execute(
        "UPDATE jobs SET admitted_at = dispatched_at"
        " WHERE dispatched_at IS NOT NULL AND state IN ('queued', 'running')"
    )
    op.create_table(
        "org_limits",
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("org", name=op.f("pk_org_limits")),
    )


def downgrade() -> None:
    op.drop_table("org_limits")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_awaiting_slot")
        batch_op.drop_column("awaiting_slot_since")
        batch_op.drop_column("admitted_at")
