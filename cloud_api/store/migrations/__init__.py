"""Alembic migrations of the record store (script location ``cloud_api.store:migrations``)."""
