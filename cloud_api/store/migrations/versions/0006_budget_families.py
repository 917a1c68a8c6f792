"""budget families as rows: a ledger's per-family figures in ``budget_families``

Before: ``budgets`` had a column per family and figure (``dchi_epsilon``, ``dchi_metric``,
``dchi_tokens``, ``dchi_sends``, ``laplace_epsilon``, ``laplace_sends``, ``rr_epsilon``,
``rr_sends``, ``texthide_sends``, ``none_sends``), so a new budget family needed a migration.
After: one ``budget_families`` row per key id, device id and family (epsilon, metric,
tokens, sends), made at the family's first charge; ``budgets`` keeps the total spent, the
sends and the cap. Every non-zero figure is carried over; a family without figures has no
row, which reads as zeros, as before. The downgrade puts the five built-in families back
into their columns (the rows of any other family have no column to go to and are dropped).

Revision ID: 0006_budget_families
Revises: 0005_key_caps
Create Date: 2025-01-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_budget_families"
down_revision = "0005_key_caps"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# family -> its columns in 0005: (epsilon, metric, tokens, sends); None: it had none
COLUMNS = {
    "dchi": ("dchi_epsilon", "dchi_metric", "dchi_tokens", "dchi_sends"),
    "laplace": ("laplace_epsilon", None, None, "laplace_sends"),
    "randomized-response": ("rr_epsilon", None, None, "rr_sends"),
    "texthide": (None, None, None, "texthide_sends"),
    "none": (None, None, None, "none_sends"),
}
DOUBLES = {c for cols in COLUMNS.values() for c in cols[:2] if c}


def _old_columns() -> list[str]:
    return [c for cols in COLUMNS.values() for c in cols if c]


def upgrade() -> None:
    op.create_table(
        "budget_families",
        sa.Column("id", BigId, nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("epsilon", sa.Double, nullable=False),
        sa.Column("metric", sa.Double, nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
        sa.Column("sends", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_families")),
        sa.UniqueConstraint("key_id", "device_id", "family",
                            name=op.f("uq_budget_families_key_id_device_id_family")),
    )
    for family, cols in COLUMNS.items():
        eps, metric, tokens, sends = (c or ("0.0" if i < 2 else "0")
                                      for i, c in enumerate(cols))
        nonzero = " OR ".join(f"{c} <> 0" for c in cols if c)
        op.execute(sa.text(
            "INSERT INTO budget_families (key_id, device_id, family, epsilon, metric, tokens, "
            f"sends) SELECT key_id, device_id, :family, {eps}, {metric}, {tokens}, {sends} "
            f"FROM budgets WHERE {nonzero}").bindparams(family=family))
    with op.batch_alter_table("budgets") as batch:
        for c in _old_columns():
            batch.drop_column(c)


def downgrade() -> None:
    with op.batch_alter_table("budgets") as batch:
        for c in _old_columns():
            kind = sa.Double if c in DOUBLES else sa.BigInteger
            batch.add_column(sa.Column(c, kind, nullable=False, server_default="0"))
    sets = []
    for family, cols in COLUMNS.items():
        for col, what in zip(cols, ("epsilon", "metric", "tokens", "sends"), strict=True):
            if col:
                sets.append(f"{col} = coalesce((SELECT f.{what} FROM budget_families f WHERE "
                            "f.key_id = budgets.key_id AND f.device_id = budgets.device_id "
                            f"AND f.family = '{family}'), 0)")
    op.execute(f"UPDATE budgets SET {', '.join(sets)}")
    with op.batch_alter_table("budgets") as batch:
        for c in _old_columns():
            batch.alter_column(c, server_default=None)
    op.drop_table("budget_families")
