"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_table(
        "job_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("prompt_id", sa.String(length=40), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "queued",
                "running",
                "succeeded",
                "failed",
                "cancelled",
                "superseded",
                name="job_state",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index("ix_job_events_job_id", ["job_id", "id"], unique=False)
        batch_op.create_index("ix_job_events_org_id", ["org", "id"], unique=False)

    op.create_table(
        "prompts",
        sa.Column("prompt_id", sa.String(length=40), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("parent_id", sa.String(length=40), nullable=True),
        sa.Column("correlation_id", sa.String(length=128), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("prompt_id", name=op.f("pk_prompts")),
        sa.UniqueConstraint("org", "author", "idempotency_key", name="uq_prompts_idempotency"),
    )
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.create_index("ix_prompts_org_created", ["org", "created_at"], unique=False)

    op.create_table(
        "responses",
        sa.Column("response_id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("prompt_id", sa.String(length=40), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("provider_request_id", sa.String(length=255), nullable=True),
        sa.Column("finish_reason", sa.String(length=64), nullable=True),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("response_id", name=op.f("pk_responses")),
    )
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.create_index("ix_responses_job", ["job_id"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("prompt_id", sa.String(length=40), nullable=False),
        sa.Column("org", sa.String(length=64), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "queued",
                "running",
                "succeeded",
                "failed",
                "cancelled",
                "superseded",
                name="job_state",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("progress_rank", sa.Integer(), nullable=False),
        sa.Column("error_kind", sa.String(length=32), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("response_id", sa.String(length=40), nullable=True),
        sa.Column("supersedes", sa.String(length=40), nullable=True),
        sa.Column("superseded_by", sa.String(length=40), nullable=True),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "last_event_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["prompt_id"], ["prompts.prompt_id"], name=op.f("fk_jobs_prompt_id_prompts")
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_org_author_last_event", ["org", "author", "last_event_id"], unique=False
        )
        batch_op.create_index("ix_jobs_org_last_event", ["org", "last_event_id"], unique=False)
        batch_op.create_index("ix_jobs_prompt", ["prompt_id"], unique=False)
        batch_op.create_index("ix_jobs_state_updated", ["state", "updated_at"], unique=False)
        batch_op.create_index("ix_jobs_undispatched", ["dispatched_at", "state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_undispatched")
        batch_op.drop_index("ix_jobs_state_updated")
        batch_op.drop_index("ix_jobs_prompt")
        batch_op.drop_index("ix_jobs_org_last_event")
        batch_op.drop_index("ix_jobs_org_author_last_event")

    op.drop_table("jobs")
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.drop_index("ix_responses_job")

    op.drop_table("responses")
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.drop_index("ix_prompts_org_created")

    op.drop_table("prompts")
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index("ix_job_events_org_id")
        batch_op.drop_index("ix_job_events_job_id")

    op.drop_table("job_events")
    op.drop_table("api_keys")
