"""What a job does: retraining (``retrain.py``) and pretraining (``pretrain.py``) in the
child process ``python -m cloud_api.jobs.run ATTEMPT_DIR`` (``run.py``), the attempt folder
the worker and the child share (``files.py``), and the checks made when a job is
submitted (``specs.py``). The claim loop that starts children is ``cloud_api/worker.py``."""
