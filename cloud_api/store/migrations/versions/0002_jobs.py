"""jobs: the queue of retraining and pretraining jobs (cloud_api/jobs/table.py)

Revision ID: 0002_jobs
Revises: 0001_records
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_jobs"
down_revision = "0001_records"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", BigId, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("worker_id", sa.String(128)),
        sa.Column("created_by", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("claimed_at", sa.DateTime(timezone=True)),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("progress", sa.JSON),
        sa.Column("error", sa.Text),
        sa.Column("log_tail", sa.Text),
        sa.Column("result", sa.JSON),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("watermark", BigId),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.CheckConstraint("state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
                           name=op.f("ck_jobs_state")),
        sa.CheckConstraint("kind IN ('retrain', 'pretrain')", name=op.f("ck_jobs_kind")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_jobs_state_id"), "jobs", ["state", "id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_state_id"), "jobs")
    op.drop_table("jobs")
