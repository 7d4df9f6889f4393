"""The process groups shardcore creates, and the sub-groups of a tensor-parallel group that hold the
same replicated shard.

Every group shardcore creates comes through :func:`new_group` or the layout's device mesh
carrying :func:`mesh_backend_override`. On a world with a device backend that has its own watchdog
(NCCL) its timeout is :data:`GROUP_WAIT_FACTOR` times the collective bound in force
(:func:`group_timeout`), as for the world group ``init_from_env`` starts, so a hung collective
ends the process soon after shardcore named it (``watch.py``), not at NCCL's default of 10 minutes
(under ``"cpu:gloo,cuda:nccl"`` the gloo part waits as long); on a gloo-only world a group keeps
torch's default (shardcore's bounded waits end a hang there). The replica sub-groups are made one
block at a time, not as a device mesh's rows: a mesh would also build its column groups (a rank
from every block, unused), and slicing them out of the layout's mesh needs DeviceMesh's private
``_unflatten``.

A layer whose heads are fewer than the tensor-parallel ranks (grouped-query attention's key/value
heads at TP=4 with 2 heads) holds each head on a block of consecutive ranks; the gradients of those
copies are summed over the block's sub-group. Creating groups is collective over the whole world,
so it happens once, before any layer is built (:func:`prepare_replica_groups`, which
:func:`shardcore.optimize` calls); a layer's constructor only looks its sub-groups up.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from .ranks import PaperGroup, group_key, group_ranks, group_size
from .scope import DEFAULT_SCOPE, resolve_timeout
from .watch import WATCHDOG_BACKENDS, backends

__all__ = [
    "GROUP_WAIT_FACTOR",
    "group_timeout",
    "mesh_backend_override",
    "mesh_device",
    "new_group",
    "own_row_group",
    "prepare_replica_groups",
    "replica_group",
]

#: a group shardcore creates on a watchdog backend waits this many collective bounds
GROUP_WAIT_FACTOR = 2

#: ``{(group key, blocks): (group, the sub-group holding this rank)}``; the group is held so a
#: later group with the same ranks (after the first was destroyed) is not handed stale sub-groups
_REPLICA_GROUPS: dict[tuple, tuple] = {}


def _block_sizes(size: int) -> list[int]:
    return [b for b in range(2, size + 1) if size % b == 0]


def prepare_replica_groups(group, tp_groups: list[list[int]] | None = None) -> None:
    """Create this rank's replica sub-groups of ``group`` for every block size that divides it.

    Collective over the whole world: every rank calls it, with its own tensor-parallel group, in
    the same order. ``tp_groups``, every tensor-parallel group's global ranks, comes from the
    layout's mesh when known; else one ``all_gather_object`` finds them. Nothing happens for a
    group of one rank, a :class:`PaperGroup`, or a group prepared before.
    """
    if isinstance(group, PaperGroup) or group_size(group) == 1:
        return
    key = group_key(group)
    sizes = _block_sizes(len(key))
    if all(_REPLICA_GROUPS.get((key, b), (None,))[0] is group for b in sizes):
        return
    _REPLICA_GROUPS[(key, len(key))] = (group, group)  # one block of every rank: the group itself
    smaller = sizes[:-1]
    if not smaller:
        return
    if tp_groups is None:
        tp_groups = [None] * dist.get_world_size()
        dist.all_gather_object(tp_groups, list(key))
    me = dist.get_rank()
    for blocks in smaller:  # every rank creates every block of every tp group, in one order, keeps its own
        rows = [
            list(tp[b : b + blocks]) for tp in sorted({tuple(r) for r in tp_groups}) for b in range(0, len(tp), blocks)
        ]
        _REPLICA_GROUPS[(key, blocks)] = (group, own_row_group(rows, me))


def mesh_device() -> str:
    """The device type of the meshes shardcore builds: ``"cuda"`` when the world runs NCCL (alone or
    beside gloo, ``"cpu:gloo,cuda:nccl"``: FSDP2 places a module's shards on its mesh's device), else ``"cpu"``."""
    return "cuda" if dist.is_initialized() and "nccl" in backends().values() and torch.cuda.is_available() else "cpu"


def group_timeout() -> timedelta | None:
    """The timeout of a group shardcore creates now: :data:`GROUP_WAIT_FACTOR` times the collective
    bound in force (the model being optimized sets it first) when the world has a watchdog backend
    (NCCL), else ``None`` (torch's default)."""
    if not dist.is_initialized() or not set(backends().values()) & WATCHDOG_BACKENDS:
        return None
    return timedelta(seconds=GROUP_WAIT_FACTOR * resolve_timeout(DEFAULT_SCOPE.timeout_s))


def mesh_backend_override(dims: tuple[str, ...], shape: tuple[int, ...]) -> dict | None:
    """``init_device_mesh``'s ``backend_override`` giving the groups of each of ``dims`` (sizes
    ``shape``) :func:`group_timeout` (a device mesh takes a timeout only in NCCL's options; the
    world's backend kept); ``None`` where there is none to give. A dimension spanning the world
    reuses the world group, as torch's mesh does without an override."""
    timeout = group_timeout()
    if timeout is None or "nccl" not in backends().values() or not hasattr(dist, "ProcessGroupNCCL"):
        return None
    override = {}
    for d, size in zip(dims, shape, strict=True):
        if size == dist.get_world_size():
            continue
        options = dist.ProcessGroupNCCL.Options()  # one per dimension: torch's NCCL fills in each group's name
        options._timeout = timeout
        override[d] = options
    return override or None


def new_group(ranks: list[int]):
    """A process group of the global ``ranks``: collective over the whole world (every rank calls it,
    in the same order, member or not), as ``torch.distributed.new_group``; the group's backend is
    the default group's (``"cpu:gloo,cuda:nccl"`` gives it both), its timeout :func:`group_timeout`."""
    return dist.new_group(ranks, timeout=group_timeout())


def own_row_group(rows: list[list[int]], rank: int):
    """Make a group of each of ``rows`` (global ranks; collective: every rank makes every row, in one
    order) and return the one holding ``rank``."""
    made = [new_group(ranks) for ranks in rows]
    return next(g for g, ranks in zip(made, rows, strict=True) if rank in ranks)


def replica_group(group, blocks: int):
    """The sub-group of ``group`` holding the same replicated shard as this rank (no collective:
    :func:`prepare_replica_groups` made it). ``group``'s ranks are cut into consecutive blocks of
    ``blocks`` ranks."""
    if isinstance(group, PaperGroup):  # explain: the same rank arithmetic, no group created
        return PaperGroup(group.rank % blocks, blocks)
    entry = _REPLICA_GROUPS.get((group_key(group), blocks))
    if entry is None or entry[0] is not group:
        raise RuntimeError(
            f"the replica sub-groups of tensor-parallel group {group_ranks(group)} are not prepared: call "
            "shardcore.distributed.prepare_replica_groups(group) on every rank before building a layer with "
            "replicated heads (shardcore.optimize does); creating groups is collective over the whole world"
        )
    return entry[1]
