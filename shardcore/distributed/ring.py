"""A ring step between the ranks of a group: each sends to the next and receives from the previous
(point to point), counted and bounded like every shardcore collective (:mod:`.collectives`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import Pending, global_rank, group_rank, group_size
from .scope import _count

__all__ = ["start_ring_shift"]


class _Works:
    """The send and the receive of one ring step, waited for as one."""

    def __init__(self, works) -> None:
        self.works = list(works)

    def wait(self, timeout=None) -> None:
        for work in self.works:
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout=timeout)

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def start_ring_shift(x: torch.Tensor, group, *, where: str | None = None) -> Pending:
    """Start one step of a ring: send ``x`` to the group's next rank and receive the previous
    rank's (same shape and dtype); ``wait()`` returns the received tensor. Counted as
    ``"ring_shift"``; waited for within the bound (on NCCL, on the stream)."""
    world = group_size(group)
    if world == 1:
        return Pending(None, "ring_shift", group, where, lambda: x)
    _count("ring_shift", where, x)
    rank = group_rank(group)

    def peer(r: int) -> int:
        return global_rank(group, r % world)

    x = x.contiguous()
    received = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, peer(rank + 1), group), dist.P2POp(dist.irecv, received, peer(rank - 1), group)]
    return Pending(_Works(dist.batch_isend_irecv(ops)), "ring_shift", group, where, lambda: received, x.device)
