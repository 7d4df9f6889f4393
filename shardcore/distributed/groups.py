"""Sub-groups of a tensor-parallel group: the ranks holding the same replicated shard."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["replica_group"]

_REPLICA_GROUPS: dict[tuple[int, int], object] = {}


def replica_group(group, blocks: int):
    """The sub-group of ``group`` holding the same replicated shard as this rank.

    ``group``'s ranks are cut into consecutive blocks of ``blocks`` ranks; every rank of the
    world must call this with the same arguments (it creates groups). Cached per group.
    """
    from .collectives import PaperGroup

    if isinstance(group, PaperGroup):  # explain: the same rank arithmetic, no group created
        return PaperGroup(group.rank % blocks, blocks)
    key = (id(group), blocks)
    if key not in _REPLICA_GROUPS:
        ranks = dist.get_process_group_ranks(group)
        # new_group is collective over the whole world: every rank creates every sub-group of
        # every tp group, in the same order, and keeps its own.
        all_tp = [None] * dist.get_world_size()
        dist.all_gather_object(all_tp, ranks)
        mine = None
        for tp_ranks in sorted({tuple(r) for r in all_tp}):
            for b in range(0, len(tp_ranks), blocks):
                sub = dist.new_group(list(tp_ranks[b : b + blocks]))
                if dist.get_rank() in tp_ranks[b : b + blocks]:
                    mine = sub
        _REPLICA_GROUPS[key] = mine
    return _REPLICA_GROUPS[key]
