"""indexes for the API's reads: polling by state, members' and prompts' event streams

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_org_state_last_event", ["org", "state", "last_event_id"], unique=False
        )
        batch_op.create_index(
            "ix_jobs_org_author_state_last_event",
            ["org", "author", "state", "last_event_id"],
            unique=False,
        )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index("ix_job_events_org_author_id", ["org", "author", "id"], unique=False)
        batch_op.create_index("ix_job_events_prompt_id", ["prompt_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index("ix_job_events_prompt_id")
        batch_op.drop_index("ix_job_events_org_author_id")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_org_author_state_last_event")
        batch_op.drop_index("ix_jobs_org_state_last_event")
