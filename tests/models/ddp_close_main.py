"""Run under ``torchrun --nproc-per-node 2``: leave a DDP wrapper in a reference cycle, then
``models.training.distributed.close``.

    torchrun --standalone --nproc-per-node 2 tests/models/ddp_close_main.py [cycle|one-leaves]

``cycle``: each rank prints how many ``DistributedDataParallel`` objects are still alive
after ``close``. A wrapper that outlives ``close`` keeps its gloo group until the
interpreter shuts down, where the process aborts at random ("terminate called without an
active exception"). ``one-leaves``: rank 1 leaves as on an error (no barrier) while rank 0,
done, closes a moment later; rank 0 must still leave cleanly. Used by
tests/models/test_distributed.py.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from models.training import distributed  # noqa: E402


def main(mode: str) -> None:
    torch.set_num_threads(1)
    ctx = distributed.init_from_env("cpu")
    assert ctx is not None and ctx.backend == "gloo"
    if mode == "one-leaves":
        torch.distributed.all_reduce(torch.ones(2))
        if ctx.rank == 1:
            distributed.close(ctx, wait_for_peers=False)
        else:
            time.sleep(1.0)  # the peer is gone by now
            distributed.close(ctx)
        print(f"rank {ctx.rank}: left", flush=True)
        return
    net = distributed.wrap(torch.nn.Linear(4, 2), ctx)
    for _ in range(3):
        net(torch.randn(8, 4)).sum().backward()
    net.cycle = [net]  # only the cyclic collector can free it
    del net
    distributed.close(ctx)
    alive = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    print(f"rank {ctx.rank}: {alive} DDP wrapper(s) alive after close", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
