"""a key's cap is the key's: its own row counts every device, device caps, refunds; task pairs

Before: each of a key's rows (its own, requests without X-Device-Id, and one per device)
spent separately under a copy of the key's cap. After: the key's row counts everything the
key sent (its old figures plus every device's), device rows keep their own spend under a
cap of their own (NULL: the key's cap alone), refunds of unanswered predictions are
audited in ``budget_refunds``, and a task says whether its records are sentence pairs
(true where a stored record of it already is one).

Revision ID: 0005_key_caps
Revises: 0004_budgets
Create Date: 2025-01-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_key_caps"
down_revision = "0004_budgets"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
SUMMED = ["spent", "sends", "dchi_epsilon", "dchi_metric", "dchi_tokens", "dchi_sends",
          "laplace_epsilon", "laplace_sends", "rr_epsilon", "rr_sends", "texthide_sends",
          "none_sends"]


def _fold_devices(sign: str) -> None:
    """Add (``+``) or take off (``-``) the device rows' figures on their key's row."""
    sets = ", ".join(
        f"{c} = {c} {sign} (SELECT coalesce(sum(d.{c}), 0) FROM budgets d "
        f"WHERE d.key_id = budgets.key_id AND d.device_id <> '')" for c in SUMMED)
    op.execute(f"UPDATE budgets SET {sets} WHERE device_id = ''")


def upgrade() -> None:
    _fold_devices("+")
    op.execute("UPDATE budgets SET cap = NULL WHERE device_id <> ''")  # they were copies
    op.create_table(
        "budget_refunds",
        sa.Column("id", BigId, nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("epsilon", sa.Double),
        sa.Column("metric", sa.Double, nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
        sa.Column("sends", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_refunds")),
    )
    op.create_index(op.f("ix_budget_refunds_key_id"), "budget_refunds", ["key_id"])
    # plain ALTER TABLE (a batch copy of tasks would trip the records' foreign key on SQLite)
    op.add_column("tasks", sa.Column("pairs", sa.Boolean, nullable=False,
                                     server_default=sa.false()))
    op.execute("UPDATE tasks SET pairs = true WHERE EXISTS (SELECT 1 FROM records r WHERE "
               "r.task_id = tasks.id AND r.segments IS NOT NULL AND "
               "json_array_length(r.segments) = 2)")


def downgrade() -> None:
    op.execute("ALTER TABLE tasks DROP COLUMN pairs")  # SQLite >= 3.35 and PostgreSQL
    op.drop_index(op.f("ix_budget_refunds_key_id"), "budget_refunds")
    op.drop_table("budget_refunds")
    _fold_devices("-")
    op.execute("UPDATE budgets SET cap = (SELECT k.cap FROM budgets k WHERE "
               "k.key_id = budgets.key_id AND k.device_id = '') WHERE device_id <> ''")
