"""The cloud side: FastAPI service, storage, retraining worker (torch lives here and in models/)."""
