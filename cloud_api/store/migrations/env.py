"""Alembic environment: run on the connection :class:`cloud_api.store.db.Database` passes in
``config.attributes["connection"]`` (there is no alembic.ini; see ``Database.upgrade``)."""

from __future__ import annotations

from alembic import context

import cloud_api.jobs.table  # noqa: F401 - the jobs table, on the same MetaData
from cloud_api.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through cloud_api.store.db.Database "
                       "(`cloud-api db upgrade`), not the alembic command")

context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
