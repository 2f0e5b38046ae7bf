"""CHECK constraints: a job's state and error kind, and an event's state, are the lifecycle's

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As projections/domain/lifecycle.py spelled them when this migration was written; a later change of
# the lifecycle's words comes with a migration of its own.
STATES = "'queued', 'running', 'succeeded', 'failed', 'cancelled', 'superseded'"
ERROR_KINDS = (
    "'timeout', 'rate_limit', 'provider_5xx', 'provider_4xx', 'parse', 'auth', "
    "'worker_crash', 'stuck', 'unknown'"
)


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_check_constraint(op.f("ck_jobs_state"), f"state IN ({STATES})")
        batch_op.create_check_constraint(
            op.f("ck_jobs_error_kind"), f"error_kind IN ({ERROR_KINDS})"
        )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_check_constraint(op.f("ck_job_events_state"), f"state IN ({STATES})")


def downgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_job_events_state"), type_="check")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_jobs_error_kind"), type_="check")
        batch_op.drop_constraint(op.f("ck_jobs_state"), type_="check")
