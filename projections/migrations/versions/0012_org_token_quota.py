"""An org's own token quota: org_limits.tpm, and org_limits.max_running may be null (default)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("org_limits", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tpm", sa.Integer(), nullable=True))
        batch_op.alter_column("max_running", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM org_limits WHERE max_running IS NULL")
    with op.batch_alter_table("org_limits", schema=None) as batch_op:
        batch_op.alter_column("max_running", existing_type=sa.Integer(), nullable=False)
        batch_op.drop_column("tpm")
