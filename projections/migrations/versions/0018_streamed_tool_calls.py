"""A job's streamed output holds the tool calls its attempt has streamed so far

A row written before has none (NULL): its attempt streamed text only.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_outputs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tool_calls", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_outputs", schema=None) as batch_op:
        batch_op.drop_column("tool_calls")
