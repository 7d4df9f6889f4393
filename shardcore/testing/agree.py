"""A rank-local check that fails on every rank when it fails on one."""

from __future__ import annotations

from collections.abc import Callable

import torch


def _on_every_rank(check: Callable[[], float]) -> float:
    """``check()`` (a rank-local check: this rank's slices), failing on every rank of the world when
    it fails on one: a rank that went on to the next step's collectives would wait for ever."""
    import torch.distributed as dist

    from ..distributed.collectives import all_reduce, group_device

    failure = None
    try:
        result = check()
    except AssertionError as err:
        failure, result = err, 0.0
    if dist.is_initialized():
        flag = torch.tensor([0.0 if failure is None else 1.0], device=group_device(dist.group.WORLD))
        all_reduce(flag, dist.group.WORLD, op=dist.ReduceOp.MAX, where="the kit: did a rank's own check fail")
        if failure is None and flag.item():
            raise AssertionError("another rank's check of its own slices failed (its message is in its report)")
    if failure is not None:
        raise failure
    return result
