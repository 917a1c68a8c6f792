"""Retraining and pretraining jobs, from the queue to the registered version.

- ``states.py``: kinds, job states and outcomes (enums of the stored strings).
- ``table.py`` and ``queue.py``: the job table and its SQL operations (enqueue, claim,
  heartbeat, finish, release, reap, cancel), shared by every worker.
- ``specs.py``: the checks made when a job is submitted.
- ``supervisor.py``: the worker's claim loop and reaper; ``attempt.py`` one attempt of a
  job (its child process, heartbeats, cancel, end); ``children.py`` their command lines,
  environment and signals; ``cli.py`` is ``cloud-api worker``.
- ``publisher.py``: what a finished job leaves: a base, or a version promoted by the
  job's rule (compare, decide, promote).
- the child side: ``run.py`` (``python -m cloud_api.jobs.run ATTEMPT_DIR``, or under
  torchrun through ``launch.py``) runs ``retrain.py`` or ``pretrain.py``; ``compare.py``
  measures the promoted version on a job's test rows; ``files.py`` is the attempt folder
  the worker and its child share.

No web framework is imported here: the admin routes call in, never the other way.
"""
