"""A job's own webhook URL (and the events it wants), and each org's signing secret for them

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("webhook", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("webhook_events", sa.JSON(), nullable=True))
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("url", sa.Text(), nullable=True))
    op.create_index(
        "ix_webhook_deliveries_org_endpoint_created",
        "webhook_deliveries",
        ["org", "endpoint_id", "created_at"],
    )
    op.create_table(
        "webhook_signing",
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("secret", sa.String(length=100), nullable=False),
        sa.Column("previous_secret", sa.String(length=100), nullable=True),
        sa.Column("previous_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("org", name=op.f("pk_webhook_signing")),
    )


def downgrade() -> None:
    op.drop_table("webhook_signing")
    op.drop_index("ix_webhook_deliveries_org_endpoint_created", "webhook_deliveries")
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_column("url")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("webhook_events")
        batch_op.drop_column("webhook")
