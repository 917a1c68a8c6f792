"""job names: a live job (queued or running) reserves a name of its kind, atomically

``jobs.reserved`` holds the name a job claims while it lives (a pretraining job: the base
it will write); a partial unique index on ``(kind, reserved)`` over the queued and running
rows makes two concurrent submissions of the same name end in one job and one 409, on
SQLite and on PostgreSQL alike. A finished job frees its name (the base folder then
guards it, ``cloud_api.jobs.specs.check_pretrain``).

Revision ID: 0003_job_names
Revises: 0002_jobs
Create Date: 2025-01-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_job_names"
down_revision = "0002_jobs"
branch_labels = None
depends_on = None

LIVE = sa.text("state IN ('queued', 'running')")


def upgrade() -> None:
    op.add_column("jobs", sa.Column("reserved", sa.String(128)))
    _reserve_live_names()
    op.create_index("uq_jobs_live_kind_reserved", "jobs", ["kind", "reserved"], unique=True,
                    sqlite_where=LIVE, postgresql_where=LIVE)


def _reserve_live_names() -> None:
    """Pretraining jobs already queued or running at the upgrade reserve their base name
    too (the oldest one where two share a name, as the old race could leave them; the
    later one fails when it finds the base written, as before)."""
    jobs = sa.table("jobs", sa.column("id", sa.BigInteger), sa.column("kind", sa.String),
                    sa.column("state", sa.String), sa.column("spec", sa.JSON),
                    sa.column("reserved", sa.String))
    conn = op.get_bind()
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.spec).where(
        jobs.c.kind == "pretrain", jobs.c.state.in_(("queued", "running"))
    ).order_by(jobs.c.id)).all()
    taken: set[str] = set()
    for job_id, spec in rows:
        name = (spec or {}).get("name") if isinstance(spec, dict) else None
        if isinstance(name, str) and name not in taken:
            taken.add(name)
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(reserved=name))


def downgrade() -> None:
    op.drop_index("uq_jobs_live_kind_reserved", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("reserved")
