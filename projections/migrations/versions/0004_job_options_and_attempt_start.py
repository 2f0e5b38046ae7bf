"""Each job's own options (a retry may replace the prompt's) and its current attempt's start

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("options", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("attempt_started_at", sa.DateTime(timezone=True), nullable=True)
        )
    # Every job so far ran with its prompt's options; of its starts only the first was kept.
    op.execute(
        "UPDATE jobs SET options = (SELECT prompts.options FROM prompts "
        "WHERE prompts.prompt_id = jobs.prompt_id), attempt_started_at = started_at"
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("attempt_started_at")
        batch_op.drop_column("options")
