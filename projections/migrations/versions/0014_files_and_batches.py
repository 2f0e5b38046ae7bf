"""OpenAI's Files and Batch APIs: files, file_chunks, batches, batch_lines

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("batch_id", sa.String(length=40), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("input_file_id", sa.String(length=40), nullable=False),
        sa.Column("completion_window", sa.String(length=16), nullable=False),
        sa.Column("metadata", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("errors", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("output_file_id", sa.String(length=40), nullable=True),
        sa.Column("error_file_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("in_progress_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finalizing_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelling_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expired_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_batches")),
    )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.create_index("ix_batches_org_created", ["org", "created_at"], unique=False)
        batch_op.create_index("ix_batches_status", ["status"], unique=False)

    op.create_table(
        "files",
        sa.Column("file_id", sa.String(length=40), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("file_id", name=op.f("pk_files")),
    )
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.create_index("ix_files_org_created", ["org", "created_at"], unique=False)

    op.create_table(
        "batch_lines",
        sa.Column("batch_id", sa.String(length=40), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(length=512), nullable=False),
        sa.Column("prompt_id", sa.String(length=40), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.batch_id"], name=op.f("fk_batch_lines_batch_id_batches")
        ),
        sa.PrimaryKeyConstraint("batch_id", "line", name=op.f("pk_batch_lines")),
        sa.UniqueConstraint("batch_id", "custom_id", name="uq_batch_lines_custom_id"),
    )
    with op.batch_alter_table("batch_lines", schema=None) as batch_op:
        batch_op.create_index("ix_batch_lines_prompt", ["prompt_id"], unique=False)

    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.String(length=40), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("file_id", "seq", name=op.f("pk_file_chunks")),
    )


def downgrade() -> None:
    op.drop_table("file_chunks")
    with op.batch_alter_table("batch_lines", schema=None) as batch_op:
        batch_op.drop_index("ix_batch_lines_prompt")

    op.drop_table("batch_lines")
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.drop_index("ix_files_org_created")

    op.drop_table("files")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_index("ix_batches_status")
        batch_op.drop_index("ix_batches_org_created")

    op.drop_table("batches")
