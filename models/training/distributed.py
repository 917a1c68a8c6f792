"""PyTorch DDP under ``torchrun``: process group, device, sharded batches, shared decisions.

``torchrun --nproc-per-node N -m cloud_api.jobs.run JOB_DIR`` starts N processes with
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR`` in their environment;
:func:`init_from_env` joins them into one process group (gloo on CPU, nccl on CUDA).
Fine-tuning then wraps the classifier in ``DistributedDataParallel``; every rank builds
the same shuffled list of length buckets from a seed rank 0 chose, and takes every
N-th batch (:func:`shard`), the ``DistributedSampler`` idea applied to buckets so that
padding stays small. Gradients are averaged by DDP; rank 0 writes the model version.

A single process (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``) gets ``None`` and the
training code runs exactly as before.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """This process's place in the process group."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_size_from_env() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def init_from_env(device: str = "auto") -> DistContext | None:
    """Join the process group torchrun describes; None when running alone.

    ``device`` "auto": ``cuda:LOCAL_RANK`` with nccl when CUDA is present, else CPU with
    gloo; "cpu" forces gloo on CPU.
    """
    world = world_size_from_env()
    if world <= 1:
        return None
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistContext(rank, world, local_rank, dev, backend)


def close(ctx: DistContext | None, *, wait_for_peers: bool = True) -> None:
    """Leave the process group (a no-op when alone).

    Objects that still hold the group (a ``DistributedDataParallel`` wrapper caught in a
    reference cycle) are collected first: a gloo group destroyed later, while the
    interpreter shuts down, joins its threads too late and the process aborts
    ("terminate called without an active exception"). With ``wait_for_peers`` every rank
    passes one barrier before any tears its connections down; a rank that is leaving on
    an error passes ``False`` (its peers may never reach the barrier). A peer that left
    first breaks the barrier (gloo: "Connection closed by peer"): this rank's work is done,
    so it still leaves cleanly, with a warning, rather than fail in its ``finally``.
    """
    if ctx is None or not dist.is_initialized():
        return
    gc.collect()
    if wait_for_peers:
        try:
            dist.barrier()
        except RuntimeError as exc:  # DistBackendError is one
            log.warning("rank %d: a peer left before the last barrier (%s)", ctx.rank,
                        str(exc).splitlines()[0][:200])
    dist.destroy_process_group()


def shard(batches: list, ctx: DistContext | None) -> list:
    """This rank's batches: every ``world_size``-th of ``batches``, starting at its rank.

    Every rank must run the same number of steps (each step is a collective), so the
    list is first cut to a multiple of the world size (at most ``world_size - 1`` batches
    of an epoch are left out; the shuffle differs every epoch).
    """
    if ctx is None:
        return batches
    usable = len(batches) - len(batches) % ctx.world_size
    if usable == 0:
        raise ValueError(f"{len(batches)} batch(es) cannot be shared by {ctx.world_size} "
                         "processes: use fewer processes or a smaller batch size")
    return batches[ctx.rank:usable:ctx.world_size]


def broadcast_object(obj: Any, ctx: DistContext | None, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (pickled; small objects only)."""
    if ctx is None:
        return obj
    box = [obj if ctx.rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def any_rank(flag: bool, ctx: DistContext | None) -> bool:
    """True on every rank if ``flag`` is True on any rank (one tiny all-reduce), so that
    all ranks stop at the same step and none waits forever in a collective."""
    if ctx is None:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32,
                     device=ctx.device if ctx.backend == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def all_sum(values: list[float], ctx: DistContext | None) -> list[float]:
    """Each value summed over every rank (e.g. a loss sum and an example count)."""
    if ctx is None:
        return list(values)
    dev = ctx.device if ctx.backend == "nccl" else "cpu"
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def wrap(module: torch.nn.Module, ctx: DistContext | None,
         find_unused_parameters: bool = False) -> torch.nn.Module:
    """``module`` in ``DistributedDataParallel`` (parameters copied from rank 0 first);
    ``module`` itself when alone."""
    if ctx is None:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(module, device_ids=ids, find_unused_parameters=find_unused_parameters)
