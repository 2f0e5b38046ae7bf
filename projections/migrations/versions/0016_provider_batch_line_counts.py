"""Provider batches count the result lines they could not read, and repeated ones; and
record when a send began, and its lines

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("provider_batches", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("unreadable_lines", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("duplicate_lines", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("sending_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("lines_sent", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("provider_batches", schema=None) as batch_op:
        batch_op.drop_column("lines_sent")
        batch_op.drop_column("sending_at")
        batch_op.drop_column("duplicate_lines")
        batch_op.drop_column("unreadable_lines")
