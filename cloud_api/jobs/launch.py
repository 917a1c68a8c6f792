"""torchrun that tells how its ranks ended:
``python -m cloud_api.jobs.launch ATTEMPT_DIR [torchrun arguments...]``.

It is torchrun (``torch.distributed.run.main``, the same flags and rendezvous). When ranks
fail, torchrun raises ``ChildFailedError`` holding each failed rank's exit code, negative
for the signal that killed it, and exits 1 whatever the cause. Before that exit this writes
them to ``ATTEMPT_DIR/ranks.json`` (:meth:`AttemptFiles.write_rank_failures`), so that the
worker can tell a rank killed by the kernel (SIGKILL: out of memory; retried while
attempts are left, like a single process killed by a signal) from a rank that failed
(the job fails with its reason). No torch is imported before torchrun runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cloud_api.jobs.files import AttemptFiles

if TYPE_CHECKING:  # torch: imported when torchrun runs, not before
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


def rank_failures(exc: ChildFailedError) -> list[dict]:
    """``[{"rank", "local_rank", "exitcode", "signal"}]`` of a ``ChildFailedError``,
    by rank; ``signal`` is None for a rank that exited with a code."""
    out = []
    for rank, failure in sorted(exc.failures.items()):
        code = int(failure.exitcode)
        out.append({"rank": int(rank), "local_rank": int(failure.local_rank),
                    "exitcode": code, "signal": failure.signal_name() if code < 0 else None})
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -m cloud_api.jobs.launch ATTEMPT_DIR TORCHRUN_ARGS...",
              file=sys.stderr)
        return 2
    files = AttemptFiles(Path(argv[0]))
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv[1:])
    except ChildFailedError as exc:
        files.write_rank_failures(rank_failures(exc))
        raise  # torchrun's own report (root cause, other failures) goes to the log; exit 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
