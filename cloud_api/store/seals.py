"""The digests of sealed model versions' manifests, in the database (``version_seals``):
``cloud_api.home.SealRecords`` for a home whose server or CLI has the database (issue 42:
a manifest deleted or forged in the version folder is refused)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, insert, select

from cloud_api.store.db import Database
from cloud_api.store.tables import version_seals


class DatabaseSeals:
    """``get``/``put`` of a version's sealed manifest digest."""

    def __init__(self, db: Database):
        self.db = db

    def get(self, model_id: str, version: str) -> str | None:
        with self.db.begin() as conn:
            return conn.execute(select(version_seals.c.manifest_sha256).where(
                version_seals.c.model_id == model_id,
                version_seals.c.version == version)).scalar_one_or_none()

    def put(self, model_id: str, version: str, digest: str) -> None:
        with self.db.begin(write=True) as conn:
            conn.execute(delete(version_seals).where(version_seals.c.model_id == model_id,
                                                     version_seals.c.version == version))
            conn.execute(insert(version_seals).values(
                model_id=model_id, version=version, manifest_sha256=digest,
                sealed_at=datetime.now(UTC)))
