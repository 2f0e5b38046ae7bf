"""Provider budgets learn from a probe: provider_budgets.probe_until

The first call on a provider and model that says its limits goes alone; the others wait for
its answer (projections/budgets.py).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("provider_budgets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("probe_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("provider_budgets", schema=None) as batch_op:
        batch_op.drop_column("probe_until")
