"""privacy budget ledgers: one row per API key id and X-Device-Id

Revision ID: 0004_budgets
Revises: 0003_job_names
Create Date: 2025-01-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_budgets"
down_revision = "0003_job_names"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
COUNTERS = [("dchi_epsilon", sa.Double), ("dchi_metric", sa.Double),
            ("dchi_tokens", sa.BigInteger), ("dchi_sends", sa.BigInteger),
            ("laplace_epsilon", sa.Double), ("laplace_sends", sa.BigInteger),
            ("rr_epsilon", sa.Double), ("rr_sends", sa.BigInteger),
            ("texthide_sends", sa.BigInteger), ("none_sends", sa.BigInteger)]


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("id", BigId, nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("cap", sa.Double),
        sa.Column("spent", sa.Double, nullable=False),
        sa.Column("sends", sa.BigInteger, nullable=False),
        *[sa.Column(name, kind, nullable=False) for name, kind in COUNTERS],
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budgets")),
        sa.UniqueConstraint("key_id", "device_id", name=op.f("uq_budgets_key_id_device_id")),
    )


def downgrade() -> None:
    op.drop_table("budgets")
