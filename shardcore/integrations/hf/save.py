"""``model.save_pretrained(d)`` on a sharded HuggingFace model: the complete, unsharded checkpoint.

HuggingFace's own ``save_pretrained`` would write this rank's slices under the full names (a
checkpoint ``from_pretrained`` cannot load). :func:`install_save_pretrained` gives the sharded
model a ``save_pretrained`` of the same signature that every rank calls, with or without
``is_main_process``: the tensors are gathered one at a time and streamed to disk by global rank 0
(:func:`shardcore.save_checkpoint`), with ``config.json`` and, for a model that generates,
``generation_config.json``. Arguments it cannot honour are refused by name before any collective.

Called on some ranks only (``if rank == 0: model.save_pretrained(d)``), the first collective, a
rendezvous of the whole world made before anything is written, ends in
:class:`~shardcore.CollectiveTimeout` naming the fix on the calling rank: no hang, no partial
directory. A failure while writing removes the files this call created.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ...attach import attached
from ...distributed.collectives import all_reduce, group_device

__all__ = ["install_save_pretrained"]

_WHERE = (
    "save_pretrained of a sharded model: every rank must call it (the ranks hold slices; "
    "`if rank == 0: model.save_pretrained(d)` is the usual mistake: call it on every rank, "
    "is_main_process=(rank == 0) is fine)"
)
#: HuggingFace arguments that change nothing here (hub and format options a full checkpoint keeps).
_IGNORED = {"token", "save_peft_format", "save_original_format", "safe_serialization", "commit_message"}


def _refuse(name: str, kwargs: dict) -> None:
    """Arguments the sharded save cannot honour: refused by name on every rank before any collective."""
    if kwargs.get("state_dict") is not None:
        raise ValueError(
            f"{name}.save_pretrained(state_dict=...): a sharded model's state_dict holds this rank's slices; "
            "leave state_dict out and call save_pretrained on every rank: it gathers the full tensors"
        )
    if kwargs.get("push_to_hub"):
        raise ValueError(
            f"{name}.save_pretrained(push_to_hub=True) is not supported for a sharded model; save to a "
            "directory on every rank, then upload that directory from one process"
        )
    if kwargs.get("safe_serialization") is False or kwargs.get("variant") is not None:
        raise ValueError(
            f"{name}.save_pretrained: a sharded model is saved as safetensors without a variant; "
            "leave safe_serialization and variant at their defaults"
        )
    if kwargs.get("distributed_checkpoint"):
        raise ValueError(
            f"{name}.save_pretrained(distributed_checkpoint=True): use shardcore.save_distributed(model, "
            "optimizer, path) for a resharding distributed checkpoint"
        )
    unknown = sorted(set(kwargs) - _IGNORED - {"state_dict", "push_to_hub", "variant", "distributed_checkpoint"})
    if unknown:
        raise TypeError(f"{name}.save_pretrained got arguments it does not know for a sharded model: {unknown}")


def _rendezvous() -> None:
    """Every rank of the world arrives here before anything is written (bounded, named)."""
    if dist.is_initialized():
        world = dist.group.WORLD
        all_reduce(torch.zeros(1, device=group_device(world)), world, where=_WHERE)  # NCCL: on the GPU


def _save(model: nn.Module, directory: Path, max_shard_size) -> None:
    from ...checkpoint import save_checkpoint

    save_checkpoint(model, directory, max_shard_size=max_shard_size)
    writer = not dist.is_initialized() or dist.get_rank() == 0
    generation = getattr(model, "generation_config", None)
    can_generate = getattr(model, "can_generate", lambda: False)()
    if writer and generation is not None and can_generate:
        generation.save_pretrained(directory)


def install_save_pretrained(model: nn.Module) -> None:
    """Give a sharded HuggingFace model a ``save_pretrained`` that writes the unsharded checkpoint."""
    if not callable(getattr(type(model), "save_pretrained", None)):
        return
    name = type(model).__name__

    def save_pretrained(
        save_directory: str | os.PathLike, is_main_process: bool = True, *, max_shard_size="5GB", **kwargs
    ) -> None:
        _refuse(name, kwargs)
        if os.path.isfile(save_directory):
            raise ValueError(f"{name}.save_pretrained: {save_directory} is a file, not a directory")
        _rendezvous()
        directory = Path(save_directory)
        before = set(directory.iterdir()) if directory.is_dir() else None
        try:
            _save(model, directory, max_shard_size)
        except BaseException:
            if (not dist.is_initialized() or dist.get_rank() == 0) and directory.is_dir():
                for made in set(directory.iterdir()) - (before or set()):
                    made.unlink()
                if before is None:
                    directory.rmdir()
            raise

    save_pretrained.__doc__ = __doc__
    attached(model).route(
        model,
        "save_pretrained",
        "whole_checkpoint",
        lambda inner: save_pretrained,
        what="the unsharded checkpoint, written by rank 0",
    )
