"""One process as one rank of a larger world: torch's ``fake`` process-group backend.

On the fake backend every collective completes at once without moving data (PyTorch's own DTensor
and memory-estimation tests use it), so a single process holds exactly one rank's shards,
activations, gradients and optimizer state at real shapes and runs that rank's real kernels: the
per-rank time and memory of any layout are measured on one device, and the communication the
fake backend leaves out is priced by ``explain``'s cost model.

What a simulated rank computes is not the model's numbers: whatever a collective should have
brought from another rank is left as the buffer held (a ring's received keys are uninitialized
memory). So :func:`shardcore.optimize` switches off, with a warning naming them, the checks that
compare real data across ranks: the same-weights check, the input check and ``verify``.
"""

from __future__ import annotations

import warnings

import attrs
import torch.distributed as dist

__all__ = ["DATA_CHECKS", "init_simulated_world", "is_simulated", "without_data_checks"]

#: the checks a simulated rank cannot run (their collectives bring no other rank's data), by ShardConfig field
DATA_CHECKS = {"check_inputs": False, "verify": False}


def init_simulated_world(rank: int, world_size: int) -> None:
    """Make this process rank ``rank`` of ``world_size`` on the fake backend (no peer, no network)."""
    if dist.is_initialized():
        raise RuntimeError(
            "init_simulated_world: torch.distributed is initialized already "
            f"(backend {dist.get_backend()!r}); a simulated rank needs a process of its own, or "
            "torch.distributed.destroy_process_group() first"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"init_simulated_world: rank {rank} is not in a world of {world_size}")
    from torch.testing._internal.distributed.fake_pg import FakeStore  # torch's own, used by its DTensor tests

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def is_simulated(group=None) -> bool:
    """Whether ``group`` (default: the world) is on the fake backend."""
    return dist.is_initialized() and dist.get_backend(group) == "fake"


def without_data_checks(config):
    """``config`` (a :class:`~shardcore.ShardConfig`) with :data:`DATA_CHECKS` off, and a warning naming them."""
    off = [k for k, v in DATA_CHECKS.items() if getattr(config, k) not in (v, None)] + ["the same-weights check"]
    warnings.warn(
        f"shardcore: a simulated rank (the fake process-group backend) brings no other rank's data: "
        f"{', '.join(off)} off (shardcore.distributed.simulate)",
        stacklevel=4,
    )
    return attrs.evolve(config, **DATA_CHECKS)
