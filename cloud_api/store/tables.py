"""The store's tables (SQLAlchemy Core) on one :data:`metadata`.

Alembic migrations in ``migrations/versions/`` create them (``0001_records``: tasks,
records, idempotency; ``0002_jobs``: jobs, defined in ``cloud_api/jobs/table.py`` on this same
``metadata``; ``0003_job_names``: the base name a live pretraining job reserves, unique
per kind; ``0004_budgets``: the privacy budget ledgers;
``0005_key_caps``: a key's ledger counts all its devices, device caps, refunds, a task's
``pairs``; ``0006_budget_families``: the ledgers' per-family figures as rows;
``0007_shared_models``: model versions, promotions, bundles and bases in the database, and the
shared rate-limit buckets, for replicas that share no file system; ``0008_version_seals``: the
digest of each version's sealed manifest). A payload's array is kept as its decoded little-endian bytes
(``LargeBinary``) with dtype and shape beside it, never as JSON or base64 text.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    false,
)

# Stable constraint and index names on every database (Alembic needs them to alter).
metadata = MetaData(naming_convention={
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
})

def as_utc(t: datetime | None) -> datetime | None:
    """A ``DateTime(timezone=True)`` value as read back: SQLite keeps no zone (hands back a
    naive datetime), and every time stored here is UTC."""
    return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t


# BIGINT on PostgreSQL; INTEGER on SQLite, where only "INTEGER PRIMARY KEY" is the rowid.
BigId = BigInteger().with_variant(Integer(), "sqlite")

tasks = Table(
    "tasks", metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("labels", JSON, nullable=False),         # class names, in index order
    Column("mechanism", String(32), nullable=False),
    Column("params", JSON, nullable=False),         # canonical: every field, defaults filled
    Column("bundle_id", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # token tasks: records are sentence pairs (segments [a, b]) or single sentences
    Column("pairs", Boolean, nullable=False, server_default=false()),
)

SOFT_LABEL_DTYPE = "<f8"  # records.soft_label: float64 LE, so soft labels round-trip exactly

records = Table(
    "records", metadata,
    Column("id", BigId, primary_key=True),
    Column("task_id", Integer, ForeignKey("tasks.id", ondelete="RESTRICT"), nullable=False),
    Column("label", String(64)),                    # class name; NULL for a soft label
    Column("soft_label", LargeBinary),              # float64 LE, one per class (TextHide k>1)
    Column("mechanism", String(32), nullable=False),
    Column("params", JSON, nullable=False),
    Column("bundle_id", String(64), nullable=False),
    Column("dtype", String(8), nullable=False),     # float16 | float32 | int32 | bits
    Column("shape", JSON, nullable=False),          # e.g. [12, 384]
    Column("segments", JSON),                       # sentence pairs: [len_a, len_b]
    Column("payload", LargeBinary, nullable=False),  # the array's bytes (bits: packbits)
    Column("key_id", String(64), nullable=False),   # short id of the sender's key, never it
    Column("created_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("(label IS NULL) <> (soft_label IS NULL)", name="one_label"),
    Index(None, "task_id", "id"),                   # snapshot: a task's ids in order
    Index(None, "task_id", "label"),                # counts per label
    Index(None, "key_id"),                          # erasure by key id
    sqlite_autoincrement=True,                      # ids never reused: watermarks hold
)

idempotency = Table(
    "idempotency", metadata,
    Column("id", BigId, primary_key=True),
    Column("key_id", String(64), nullable=False),
    Column("idempotency_key", String(255), nullable=False),
    Column("body_sha256", String(64), nullable=False),  # of the canonical JSON body
    Column("record_ids", JSON, nullable=False),     # the answer, in request order
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("key_id", "idempotency_key"),
)


# The privacy budget ledgers (cloud_api.store.budgets): one row per API key id ('': the
# key's own, everything it sent) and one per device under it: worst-case epsilon in total and
# sends; ``cap``: the key's cap on its row, a device's own (NULL: none) on its.
budgets = Table(
    "budgets", metadata,
    Column("id", BigId, primary_key=True),
    Column("key_id", String(64), nullable=False),
    Column("device_id", String(64), nullable=False),
    Column("cap", Double),                           # worst-case epsilon; NULL: no cap
    Column("spent", Double, nullable=False),         # worst-case epsilon, all families
    Column("sends", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("key_id", "device_id"),
)

# What each ledger spent per budget family (shared.ledger.families()): one row per key id,
# device id and family, made at the family's first charge, so a new family (a plugin's)
# needs no migration. ``epsilon``: worst-case (0 for a family without one); ``metric`` and
# ``tokens``: the dχ metric total Σ η·n and the tokens (families that count them).
budget_families = Table(
    "budget_families", metadata,
    Column("id", BigId, primary_key=True),
    Column("key_id", String(64), nullable=False),
    Column("device_id", String(64), nullable=False),
    Column("family", String(32), nullable=False),
    Column("epsilon", Double, nullable=False),
    Column("metric", Double, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("sends", BigInteger, nullable=False),
    UniqueConstraint("key_id", "device_id", "family"),
)

# Charges of predictions that got no answer, taken back (cloud_api.store.budgets.refund): the
# audit trail of every refund.
budget_refunds = Table(
    "budget_refunds", metadata,
    Column("id", BigId, primary_key=True),
    Column("key_id", String(64), nullable=False),
    Column("device_id", String(64), nullable=False),
    Column("family", String(32), nullable=False),
    Column("epsilon", Double),                       # NULL: a family without epsilon
    Column("metric", Double, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("sends", BigInteger, nullable=False),
    Column("reason", String(32), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index(None, "key_id"),
)


# Model versions and edge bundles in the database (cloud_api.store.model_store), for replicas
# that share no writable volume. A version's files are rows of ``stored_files`` under the
# folder ``models/<model_id>/<version>``; its ``model_versions`` row gets its manifest's
# SHA-256 in the same transaction as its last file, so a version without one (a number
# reserved, or an upload in progress) is never listed, fetched or promoted.
model_versions = Table(
    "model_versions", metadata,
    Column("model_id", String(64), primary_key=True),
    Column("version", String(16), primary_key=True),
    Column("number", Integer, nullable=False),           # 3 for v3: the order of versions
    Column("manifest_sha256", String(64)),               # NULL: reserved, not complete
    Column("files", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("bundle_id", String(64)),                     # the bundle its config names
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# The promoted version of each model; ``serial`` grows by one at every promotion, so a
# replica that polls this table sees a promotion back to an older version too.
model_promotions = Table(
    "model_promotions", metadata,
    Column("model_id", String(64), primary_key=True),
    Column("version", String(16), nullable=False),
    Column("serial", BigInteger, nullable=False),
    Column("promoted_at", DateTime(timezone=True), nullable=False),
)

# An edge bundle stored whole: its row is written in the transaction of its last file.
stored_bundles = Table(
    "stored_bundles", metadata,
    Column("bundle_id", String(64), primary_key=True),
    Column("files", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# A base (a BERT folder a retraining job may start from: ``bases/<name>`` of a home) stored
# whole, with its manifest's SHA-256, in the transaction of its last file.
stored_bases = Table(
    "stored_bases", metadata,
    Column("name", String(64), primary_key=True),
    Column("manifest_sha256", String(64), nullable=False),
    Column("files", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# The bytes of stored folders: ``models/<id>/<version>``, ``bundles/<bundle_id>`` or
# ``bases/<name>``, each
# file in chunks (at most model_store.CHUNK bytes a row, so no value nears PostgreSQL's
# 1 GB limit and a reader holds one chunk at a time).
stored_files = Table(
    "stored_files", metadata,
    Column("folder", String(160), primary_key=True),
    Column("path", String(255), primary_key=True),
    Column("chunk", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

# Per-key token buckets shared by every replica (cloud_api.store.rate_limits): tokens left
# and when they were counted, in the database's clock (seconds since the epoch), and
# whether the last take found a token (what the statement that took it returns).
rate_buckets = Table(
    "rate_buckets", metadata,
    Column("key_id", String(64), primary_key=True),
    Column("tokens", Double, nullable=False),
    Column("at", Double, nullable=False),
    Column("admitted", Boolean, nullable=False),         # whether the last take got a token
)


# The SHA-256 of each model version's manifest.json when it was sealed (cloud_api.store.seals,
# cloud_api.home.SealRecords): a manifest deleted or rewritten in the version folder is then
# refused (issue 42). Kept in the database, out of reach of whoever can write the folders.
version_seals = Table(
    "version_seals", metadata,
    Column("model_id", String(64), primary_key=True),
    Column("version", String(16), primary_key=True),
    Column("manifest_sha256", String(64), nullable=False),
    Column("sealed_at", DateTime(timezone=True), nullable=False),
)
