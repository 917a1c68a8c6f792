"""shared models: model versions, promotions, bundles and bases in the database; shared
rate limits

``model_versions``, ``model_promotions``, ``stored_bundles``, ``stored_bases`` and
``stored_files`` hold what ``$PRIVBERT_HOME`` holds on one machine, for replicas with no
shared writable volume
(``PRIVBERT_MODEL_STORE=database``); ``rate_buckets`` holds the per-key token buckets that
every replica shares (``PRIVBERT_RATE_LIMIT_STORE=database``). A home on disk is untouched:
``cloud-api store import-home`` copies it in.

Revision ID: 0007_shared_models
Revises: 0006_budget_families
Create Date: 2025-01-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_shared_models"
down_revision = "0006_budget_families"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("model_id", sa.String(64), nullable=False),
        sa.Column("version", sa.String(16), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("manifest_sha256", sa.String(64)),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("bundle_id", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("model_id", "version", name=op.f("pk_model_versions")),
    )
    op.create_table(
        "model_promotions",
        sa.Column("model_id", sa.String(64), nullable=False),
        sa.Column("version", sa.String(16), nullable=False),
        sa.Column("serial", sa.BigInteger, nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("model_id", name=op.f("pk_model_promotions")),
    )
    op.create_table(
        "stored_bundles",
        sa.Column("bundle_id", sa.String(64), nullable=False),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("bundle_id", name=op.f("pk_stored_bundles")),
    )
    op.create_table(
        "stored_bases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=False),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_stored_bases")),
    )
    op.create_table(
        "stored_files",
        sa.Column("folder", sa.String(160), nullable=False),
        sa.Column("path", sa.String(255), nullable=False),
        sa.Column("chunk", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("folder", "path", "chunk", name=op.f("pk_stored_files")),
    )
    op.create_table(
        "rate_buckets",
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("tokens", sa.Double, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("admitted", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_rate_buckets")),
    )


def downgrade() -> None:
    for name in ("rate_buckets", "stored_files", "stored_bases", "stored_bundles",
                 "model_promotions", "model_versions"):
        op.drop_table(name)
