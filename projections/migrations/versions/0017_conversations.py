"""A prompt may be a conversation (its messages), and a response may hold tool calls

A prompt written before reads as it was: no messages is one user message of its text.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("messages", sa.JSON(), nullable=True))
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tool_calls", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.drop_column("tool_calls")
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.drop_column("messages")
