"""Process groups and the device mesh, from torchrun's environment.

The mesh has named dims ``("dp", "tp")``: ``tp`` ranks hold slices of one model, ``dp`` replicas
hold copies (for data parallel / FSDP on top). Groups are built once per shape and cached, so
calling :func:`shardcore.optimize` many times does not leak process groups.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from .config import ShardConfig

__all__ = ["get_mesh", "init_from_env", "replica_group", "resolve_tp_size", "world_size"]

_MESHES: dict[int, DeviceMesh] = {}
_REPLICA_GROUPS: dict[tuple[int, int], object] = {}


def init_from_env() -> None:
    """Initialize ``torch.distributed`` from torchrun's variables if they are set and it is not yet.

    gloo on CPU, nccl when CUDA is available. Without torchrun's variables nothing happens and
    the process is a world of one.
    """
    if dist.is_initialized() or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def resolve_tp_size(config: ShardConfig) -> int:
    """The tensor-parallel size ``config`` asks for, checked against the world. No collective."""
    if config.tensor_parallel_process_group is not None:
        return dist.get_world_size(config.tensor_parallel_process_group)
    world = world_size()
    tp = config.tensor_parallel_size or world
    if tp > world:
        hint = (
            f"torch.distributed is not initialized: launch with `torchrun --nproc_per_node {tp} your_script.py`"
            if not dist.is_initialized()
            else f"launch {tp} processes (torchrun --nproc_per_node {tp}) or lower tensor_parallel_size"
        )
        raise ValueError(f"ShardConfig.tensor_parallel_size={tp} is larger than the world size {world}; {hint}.")
    if world % tp:
        raise ValueError(
            f"world size {world} is not a multiple of ShardConfig.tensor_parallel_size={tp}: the world is "
            f"split into data-parallel replicas of {tp} ranks; use a tensor_parallel_size that divides {world}."
        )
    return tp


def _device_type() -> str:
    return "cuda" if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"


def get_mesh(tp_size: int) -> DeviceMesh:
    """The cached ``("dp", "tp")`` mesh with ``tp_size`` ranks on ``tp`` (collective on first use)."""
    if tp_size not in _MESHES:
        from torch.distributed.device_mesh import init_device_mesh

        world = world_size()
        _MESHES[tp_size] = init_device_mesh(_device_type(), (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    return _MESHES[tp_size]


def tp_group(config: ShardConfig, tp_size: int):
    """The tensor-parallel process group for ``config`` (collective on first use)."""
    if config.tensor_parallel_process_group is not None:
        return config.tensor_parallel_process_group
    return get_mesh(tp_size).get_group("tp")


def replica_group(group, blocks: int):
    """The sub-group of ``group`` holding the same replicated shard as this rank.

    ``group``'s ranks are cut into consecutive blocks of ``blocks`` ranks; every rank of the
    world must call this with the same arguments (it creates groups). Cached per group.
    """
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
