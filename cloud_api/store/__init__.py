"""The record store: tasks, labelled privatized records, idempotency, jobs (SQLAlchemy 2).

No web framework here: ``cloud_api.routes`` call these modules, and so do the worker and
the CLI. ``db.Database`` is the engine; ``tasks`` and ``records`` are plain functions that
take it.
"""

from cloud_api.store.db import Database

__all__ = ["Database"]
