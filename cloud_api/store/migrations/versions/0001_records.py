"""tasks, records, idempotency

Revision ID: 0001_records
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_records"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("mechanism", sa.String(32), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("bundle_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
        sa.UniqueConstraint("name", name=op.f("uq_tasks_name")),
    )
    op.create_table(
        "records",
        sa.Column("id", BigId, nullable=False),
        sa.Column("task_id", sa.Integer, nullable=False),
        sa.Column("label", sa.String(64)),
        sa.Column("soft_label", sa.LargeBinary),
        sa.Column("mechanism", sa.String(32), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("bundle_id", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("shape", sa.JSON, nullable=False),
        sa.Column("segments", sa.JSON),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_records")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="RESTRICT",
                                name=op.f("fk_records_task_id_tasks")),
        sa.CheckConstraint("(label IS NULL) <> (soft_label IS NULL)",
                           name=op.f("ck_records_one_label")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_records_task_id_id"), "records", ["task_id", "id"])
    op.create_index(op.f("ix_records_task_id_label"), "records", ["task_id", "label"])
    op.create_index(op.f("ix_records_key_id"), "records", ["key_id"])
    op.create_table(
        "idempotency",
        sa.Column("id", BigId, nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("record_ids", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotency")),
        sa.UniqueConstraint("key_id", "idempotency_key",
                            name=op.f("uq_idempotency_key_id_idempotency_key")),
    )


def downgrade() -> None:
    op.drop_table("idempotency")
    op.drop_index(op.f("ix_records_key_id"), "records")
    op.drop_index(op.f("ix_records_task_id_label"), "records")
    op.drop_index(op.f("ix_records_task_id_id"), "records")
    op.drop_table("records")
    op.drop_table("tasks")
