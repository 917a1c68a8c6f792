"""The cloud side: FastAPI service, storage, the job worker (torch lives here and in models/)."""
