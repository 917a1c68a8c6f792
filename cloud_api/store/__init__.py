"""The record store: tasks, labelled privatized records, idempotency (SQLAlchemy 2); the
job table is ``cloud_api/jobs/table.py``, on the same metadata.

No web framework here: ``cloud_api.routes`` call these modules, and so do the worker and
the CLI. ``db.Database`` is the engine; ``tasks`` and ``records`` are plain functions that
take it.
"""

from cloud_api.store.db import Database

__all__ = ["Database"]
