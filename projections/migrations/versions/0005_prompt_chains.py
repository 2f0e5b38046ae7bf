"""Chains: a prompt's parents (prompts.after, prompt_parents) and what a job waits on

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "prompt_parents",
        sa.Column("prompt_id", sa.String(length=40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.String(length=40), nullable=False),
        sa.ForeignKeyConstraint(
            ["parent_id"],
            ["prompts.prompt_id"],
            name=op.f("fk_prompt_parents_parent_id_prompts"),
        ),
        sa.ForeignKeyConstraint(
            ["prompt_id"],
            ["prompts.prompt_id"],
            name=op.f("fk_prompt_parents_prompt_id_prompts"),
        ),
        sa.PrimaryKeyConstraint("prompt_id", "position", name=op.f("pk_prompt_parents")),
    )
    op.create_index("ix_prompt_parents_parent", "prompt_parents", ["parent_id"], unique=False)
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("after", sa.JSON(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("waiting_on", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("waiting_on")
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.drop_column("after")
    op.drop_index("ix_prompt_parents_parent", table_name="prompt_parents")
    op.drop_table("prompt_parents")
