"""Processes and groups: torchrun initialization, the parallel layout and its mesh, the rank launcher.

* :func:`init_from_env` starts ``torch.distributed`` from torchrun's environment (gloo on CPU,
  nccl on CUDA);
* :class:`ParallelLayout` (``layout.py``) validates ``dp x pp x sp x tp`` against the world and
  builds the ``("dp", "pp", "sp", "tp")`` device mesh, TP innermost;
* :func:`replica_group` (``groups.py``) makes the sub-groups that hold the same replicated shard;
* :class:`RankPool` / :func:`run_on_ranks` (``launcher.py``) run functions on N spawned gloo
  ranks kept alive between calls: the tests, the benchmarks and one-process launches use it;
* :func:`init_simulated_world` (``simulate.py``) makes one process one rank of a larger world on
  torch's fake backend: that rank's shards, memory and kernels are real, its collectives move nothing.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from .groups import GROUP_WAIT_FACTOR, prepare_replica_groups, replica_group
from .launcher import RankError, RankPool, close_pools, run_on_ranks
from .layout import DIMS, ParallelLayout
from .simulate import init_simulated_world, is_simulated
from .watch import FLIGHT_RECORDER, use_flight_recorder

__all__ = [
    "CUDA_BACKEND",
    "DIMS",
    "FLIGHT_RECORDER",
    "ParallelLayout",
    "RankError",
    "RankPool",
    "close_pools",
    "init_from_env",
    "init_simulated_world",
    "is_simulated",
    "prepare_replica_groups",
    "replica_group",
    "run_on_ranks",
    "use_flight_recorder",
]


#: the backend shardcore starts on GPUs: NCCL for CUDA tensors, gloo for CPU ones (PyTorch's per-device form)
CUDA_BACKEND = "cpu:gloo,cuda:nccl"


def init_from_env(timeout_s: float | None = None) -> None:
    """Initialize ``torch.distributed`` from torchrun's variables if they are set and it is not yet.

    gloo on CPU; with CUDA, :data:`CUDA_BACKEND` (``"cpu:gloo,cuda:nccl"``): NCCL for device tensors
    and gloo beside it for any CPU tensor (PyTorch picks by the tensor's device), so no CPU tensor
    ever reaches NCCL; NCCL's flight recorder on (:func:`use_flight_recorder`). The group waits twice the collective bound
    (``timeout_s``, default ``$SHARDCORE_COLLECTIVE_TIMEOUT`` or 300 s), so that in an unmatched
    call the bounded shardcore collective gives up first and names the cause, rather than a
    peer's plain barrier. Without torchrun's variables nothing happens and the process is a world
    of one.
    """
    if dist.is_initialized() or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return
    from .collectives import resolve_timeout

    timeout = timedelta(seconds=GROUP_WAIT_FACTOR * resolve_timeout(timeout_s))
    backend = "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = CUDA_BACKEND
        use_flight_recorder()
    dist.init_process_group(backend, timeout=timeout, **_restart_store(timeout))


def _restart_store(timeout: timedelta) -> dict:
    """The store for a job torchrun restarted (``--max-restarts``): by default its workers share the
    agent's store across attempts, whose keys still hold the previous attempt's addresses, and the
    new group may connect to a dead rank and fail or hang (pytorch#135712). On one node every
    worker restarts together, so each attempt gets keys of its own (a prefix naming the attempt);
    across nodes the attempts' counts need not agree, and the fix is torchrun's own."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    if os.environ.get("LOCAL_WORLD_SIZE") != os.environ["WORLD_SIZE"]:
        warnings.warn(
            f"shardcore: torchrun restarted this job (attempt {attempt}) on the store its rendezvous shares: PyTorch "
            "may hand the new process group the previous attempt's addresses (pytorch#135712) and fail or hang "
            "connecting; launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            stacklevel=3,
        )
        return {}
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False, timeout=timeout)
    return {"store": dist.PrefixStore(f"shardcore/attempt-{attempt}", agent), "rank": rank, "world_size": world}
