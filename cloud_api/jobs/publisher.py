"""What a finished job leaves behind: a base, or a model version promoted when the job's
rule allows it.

    result = Publisher(home).publish(attempt, result)   # attempt: attempt.Attempt

A pretraining job's output becomes ``bases/<name>``. A retraining job's output is
registered as the model's next version (``ModelHome.register``), and promoted when the
job's rule (``retrain.promotion_decision``) allows it against the version promoted at the
moment of the swap. The rule was applied by the child against the version promoted when
it trained; the pointer may have moved since (an admin's promote, another job's).

The model's promotion lock (``ModelHome.promotion_lock``, taken by every promotion: jobs,
``POST /admin/models/{id}/promote``, ``cloud-api models promote``) is held only for the
swap: re-read the pointer, register the version, write the pointer. A comparison never
runs under it, so an admin's promote never waits behind one. The semantics:

1. A job promotes only over the version it was compared with. Under the lock it reads the
   pointer again; if it still names that version, the job swaps; otherwise it lets go.
2. When the promoted version is not the one compared with (before the lock, or found
   under it), the comparison child ``python -m cloud_api.jobs.compare ATTEMPT_DIR
   VERSION`` (supervised like the training child: heartbeats, cancel) measures the
   version promoted now on the job's test rows, with no lock held, and the job's rule
   decides again; then ownership and cancel are checked again. A comparison that fails
   promotes nothing. So an admin's choice is never replaced by a version that was not
   measured against it, and is replaced only when the job's version is as good on the
   job's own test rows, within one binomial standard error (the rule a job always
   applies; an admin who wants no job to promote cancels the running jobs).
3. After :data:`MAX_COMPARISONS` comparisons with a pointer that kept moving, the version
   is registered and not promoted, and the result says so.
4. A promote that comes after the swap wins: the last writer of the pointer, as always.

The result's ``compared_with`` names the version finally compared with (``at_training``:
the child's), ``promoted`` and ``promotion`` what was decided and why.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

from cloud_api.errors import Conflict
from cloud_api.home import ModelHome, seal_folder
from cloud_api.jobs.children import compare_command, exit_reason
from cloud_api.jobs.files import AttemptFiles
from cloud_api.jobs.retrain import promotion_decision
from cloud_api.jobs.states import ChildExit, JobKind
from cloud_api.jobs.table import Job

log = logging.getLogger("cloud_api.worker")  # one logger name for the whole worker

COMPARE_TIMEOUT_S = 1800.0  # a comparison that never answers promotes nothing
MAX_COMPARISONS = 3  # with the pointer still moving after these, the job does not promote


class Supervised(Protocol):
    """The attempt being published, as the worker that supervises it offers it."""

    job: Job
    files: AttemptFiles

    def run_child(self, cmd: list[str], limit_s: float | None = None
                  ) -> tuple[int, ChildExit]:
        """Run ``cmd`` supervised like the training child (heartbeats, cancel)."""

    def interruption(self) -> ChildExit | None:
        """``LOST`` or ``CANCELLED`` when the output must not be registered now, else None."""


class Interrupted(Exception):
    """The comparison with the promoted version ended early: the job was cancelled or
    lost, or the worker stopped; nothing is registered."""

    def __init__(self, outcome: ChildExit):
        super().__init__(outcome)
        self.outcome = outcome


class Publisher:
    """Registers a finished attempt's output and decides its promotion."""

    def __init__(self, home: ModelHome):
        self.home = home

    def publish(self, attempt: Supervised, result: dict) -> dict:
        """Register the child's output (a model version, or a base), promote when decided."""
        job, files = attempt.job, attempt.files
        if job.kind == JobKind.PRETRAIN:
            return self._base(job, files, result)
        model_id = job.spec["model_id"]
        seal_folder(files.output)  # whole, finite and sealed, before any lock is taken
        if result["promote"]["decision"]:
            result, version, promoted, reason = self._promote(attempt, result)
        else:
            version = self.home.register(model_id, files.output, move=True, sealed=True)
            promoted, reason = False, result["promote"]["reason"]
        log.info("job %s: registered %s %s%s", job.id, model_id, version,
                 " and promoted it" if promoted else f", not promoted: {reason}")
        return {**result, "version": version, "promoted": promoted, "promotion": reason}

    def _promote(self, attempt: Supervised, result: dict) -> tuple[dict, str, bool, str]:
        """Register the output and swap the pointer to it, if the job's rule allows it
        against the version promoted at the swap (the module docstring, 1-3). Returns the
        result (``compared_with`` updated), the version, whether it was promoted, why."""
        model_id, output = attempt.job.spec["model_id"], attempt.files.output
        compared, reason = result["compared_with"]["version"], result["promote"]["reason"]
        now, comparisons = self.home.promoted(model_id), 0
        while True:
            if now != compared:  # another job or an admin promoted a version meanwhile
                if comparisons == MAX_COMPARISONS:
                    break
                comparisons += 1
                result = self._compare_again(attempt, result, now)
                promote, reason = decide_again(result)
                stop = attempt.interruption()
                if stop is not None:
                    raise Interrupted(stop)
                compared = now
                if not promote:
                    version = self.home.register(model_id, output, move=True, sealed=True)
                    return result, version, False, reason
            with self.home.promotion_lock(model_id):  # only for the swap
                now = self.home.promoted(model_id)
                if now == compared:
                    version = self.home.register(model_id, output, move=True, sealed=True)
                    self.home.write_promoted(model_id, version)
                    return result, version, True, reason
        reason = (f"not promoted: the promoted version kept changing while the job compared "
                  f"with it ({comparisons} comparisons, the last with {compared or 'none'}, "
                  f"now {now or 'none'}); promote by hand if wanted")
        version = self.home.register(model_id, output, move=True, sealed=True)
        return result, version, False, reason

    def _base(self, job: Job, files: AttemptFiles, result: dict) -> dict:
        name = job.spec["name"]
        dest = self.home.base_dir(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        seal_folder(files.output)  # a base is whole when a retraining job reads it
        try:
            dest.mkdir()  # reserve the name atomically
        except FileExistsError:
            raise Conflict(f"a base named {name!r} appeared meanwhile") from None
        os.replace(files.output, dest)
        self.home.publish_base(name)  # a shared model store: stored for every host
        return {**result, "base": name}

    def _compare_again(self, attempt: Supervised, result: dict, now: str | None) -> dict:
        """``result`` with ``compared_with`` the version promoted ``now``: its accuracy on
        the job's test rows, measured by the comparison child (``jobs/compare.py``; no
        lock is held). The child's own comparison stays in ``compared_with.at_training``.
        Raises :class:`Interrupted` when the job is cancelled, lost or the worker stopped
        meanwhile."""
        job, files = attempt.job, attempt.files
        if now is not None:  # a shared model store: fetched here first (a no-op on disk)
            self.home.materialize(job.spec["model_id"], now)
        n_test = result["records"]["test"]
        found: dict = {"version": now, "test_accuracy": None, "error": None}
        if now is not None and n_test and result["metrics"]["test_accuracy"] is not None:
            log.info("job %s: the promoted version is now %s; comparing with it", job.id, now)
            files.comparison.unlink(missing_ok=True)
            rc, outcome = attempt.run_child(compare_command(files.dir, now), COMPARE_TIMEOUT_S)
            if outcome.interrupted:
                raise Interrupted(outcome)
            out = files.read_comparison() or {}
            if outcome == ChildExit.TIMED_OUT:
                found["error"] = f"no answer within {COMPARE_TIMEOUT_S:g} s"
            elif rc == 0 and out.get("test_records") != n_test:
                found["error"] = (f"the job's test records changed since it trained ({n_test} "
                                  f"then, {out.get('test_records')} now: erased?)")
            elif rc == 0 and out.get("test_accuracy") is not None:
                found["test_accuracy"] = out["test_accuracy"]
            else:
                found["error"] = out.get("error") or exit_reason(rc, "comparison")
        before = result["compared_with"]
        return {**result, "compared_with": {**found,
                                            "at_training": before.get("at_training", before)}}


def decide_again(result: dict) -> tuple[bool, str]:
    """``promotion_decision`` (the job's own rule) against the version compared again."""
    now, before = result["compared_with"], result["compared_with"]["at_training"]
    promote, why = promotion_decision(True, result["metrics"]["test_accuracy"],
                                      now["version"], now["test_accuracy"],
                                      result["records"]["test"], now["error"])
    return promote, (f"{'' if promote else 'not promoted: '}the promoted version "
                     f"changed while the job ran ({before['version'] or 'none'} -> "
                     f"{now['version'] or 'none'}, another job or an admin promoted it); "
                     f"compared again with {now['version'] or 'none'}: {why}")
