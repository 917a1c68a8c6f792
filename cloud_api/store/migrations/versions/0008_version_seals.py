"""version seals: the SHA-256 of each model version's sealed manifest (issue 42)

A version's ``manifest.json`` lists the SHA-256 of each of its files; whoever can write the
folder could delete or rewrite it. ``version_seals`` keeps the manifest's own digest when a
version is sealed (registered, a job's output, an admin's reseal), out of the folder's
reach; a version whose manifest is missing or another is refused. Versions sealed before
this table existed are recorded on their first verified load.

Revision ID: 0008_version_seals
Revises: 0007_shared_models
Create Date: 2025-01-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_version_seals"
down_revision = "0007_shared_models"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "version_seals",
        sa.Column("model_id", sa.String(64), nullable=False),
        sa.Column("version", sa.String(16), nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=False),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("model_id", "version", name=op.f("pk_version_seals")),
    )


def downgrade() -> None:
    op.drop_table("version_seals")
