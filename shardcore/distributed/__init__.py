"""Processes and groups: torchrun initialization, the parallel layout and its mesh, the rank launcher.

* :func:`init_from_env` starts ``torch.distributed`` from torchrun's environment (gloo on CPU,
  nccl on CUDA);
* :class:`ParallelLayout` (``layout.py``) validates ``dp x pp x sp x tp`` against the world and
  builds the ``("dp", "pp", "sp", "tp")`` device mesh, TP innermost;
* :func:`replica_group` (``groups.py``) makes the sub-groups that hold the same replicated shard;
* :class:`RankPool` / :func:`run_on_ranks` (``launcher.py``) run functions on N spawned gloo
  ranks kept alive between calls: the tests, the benchmarks and one-process launches use it.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .groups import prepare_replica_groups, replica_group
from .launcher import RankError, RankPool, close_pools, run_on_ranks
from .layout import DIMS, ParallelLayout

__all__ = [
    "CUDA_BACKEND",
    "DIMS",
    "ParallelLayout",
    "RankError",
    "RankPool",
    "close_pools",
    "init_from_env",
    "prepare_replica_groups",
    "replica_group",
    "run_on_ranks",
]


#: the backend shardcore starts on GPUs: NCCL for CUDA tensors, gloo for CPU ones (PyTorch's per-device form)
CUDA_BACKEND = "cpu:gloo,cuda:nccl"
#: the process group ``init_from_env`` creates waits this many collective bounds
GROUP_WAIT_FACTOR = 2


def init_from_env(timeout_s: float | None = None) -> None:
    """Initialize ``torch.distributed`` from torchrun's variables if they are set and it is not yet.

    gloo on CPU; with CUDA, :data:`CUDA_BACKEND` (``"cpu:gloo,cuda:nccl"``): NCCL for device tensors
    and gloo beside it for any CPU tensor (PyTorch picks by the tensor's device), so no CPU tensor
    ever reaches NCCL. The group waits twice the collective bound
    (``timeout_s``, default ``$SHARDCORE_COLLECTIVE_TIMEOUT`` or 300 s), so that in an unmatched
    call the bounded shardcore collective gives up first and names the cause, rather than a
    peer's plain barrier. Without torchrun's variables nothing happens and the process is a world
    of one.
    """
    if dist.is_initialized() or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return
    from .collectives import resolve_timeout

    timeout = timedelta(seconds=GROUP_WAIT_FACTOR * resolve_timeout(timeout_s))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(CUDA_BACKEND, timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
