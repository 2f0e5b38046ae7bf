"""Structured output: the error kind schema_mismatch, a response's parsed JSON, and what a
schema_mismatch attempt answered and why it missed (its repair turn)

Rows written before have neither (NULL): no job had a schema.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The lifecycle's error kinds before and after this migration (0003 wrote the first list).
BEFORE = (
    "'timeout', 'rate_limit', 'provider_5xx', 'provider_4xx', 'parse', 'auth', "
    "'worker_crash', 'stuck', 'unknown'"
)
AFTER = BEFORE + ", 'schema_mismatch'"


def _error_kinds(kinds: str) -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_jobs_error_kind"), type_="check")
        batch_op.create_check_constraint(op.f("ck_jobs_error_kind"), f"error_kind IN ({kinds})")


def upgrade() -> None:
    _error_kinds(AFTER)
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.add_column(sa.Column("output_json", sa.JSON(), nullable=True))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("detail", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("detail")
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.drop_column("output_json")
    _error_kinds(BEFORE)
