"""What a process group is made of, asked without issuing a collective: its size, this process's
rank in it, its global ranks, a key for caches; and :class:`PaperGroup`, a group that exists only
on paper (``shardcore explain``)."""

from __future__ import annotations

import attrs
import torch.distributed as dist

__all__ = ["PaperGroup", "global_rank", "group_key", "group_rank", "group_ranks", "group_size"]


def group_key(group) -> tuple:
    """What identifies ``group`` in a cache: its global ranks (``None``: the default group's), or
    for a :class:`PaperGroup` its rank and size. Never ``id(group)``: ids are reused once a group
    is garbage-collected, and a cache keyed by them hands a new group an old group's state."""
    if isinstance(group, PaperGroup):
        return ("paper", group.rank, group.size)
    if group is None and not dist.is_initialized():
        return (0,)  # a process on its own
    return tuple(group_ranks(group))


def group_ranks(group: dist.ProcessGroup | None) -> list[int]:
    """The global ranks of ``group`` (``None``: the default group)."""
    return dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))


@attrs.frozen
class PaperGroup:
    """A tensor-parallel group that exists only on paper: this process plays ``rank`` of ``size``.

    Sharding a (meta-device) model with it computes the slices rank ``rank`` would hold, with no
    process group and no other process (``shardcore explain``); a collective on it is an error.
    """

    rank: int
    size: int


def group_size(group: dist.ProcessGroup | None) -> int:
    if isinstance(group, PaperGroup):
        return group.size
    if group is None and not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    if isinstance(group, PaperGroup):
        return group.rank
    if group is None and not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def global_rank(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of ``group``'s rank ``rank`` (``None``: the default group, whose ranks are global)."""
    return dist.get_global_rank(group, rank) if group is not None else rank
