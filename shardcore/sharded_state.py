"""Full (unsharded) views of a sharded model's parameters and gradients."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from .data_parallel import dp_full, reshard

__all__ = ["full_named_tensors", "parameter_specs"]


def parameter_specs(model: nn.Module) -> dict[str, tuple]:
    """``{parameter name: (ShardSpec, process group)}`` for every split parameter of ``model``.

    Tied parameters appear under the name ``model.named_parameters()`` gives them, whichever
    module owns the parallel layer.
    """
    by_id = {}
    for module in model.modules():  # parallel layers, and the LoRA adapters sharded beside them
        for p_name, spec in getattr(module, "shard_specs", {}).items():
            by_id[id(getattr(module, p_name))] = (spec, module.process_group)
    return {name: by_id[id(p)] for name, p in model.named_parameters() if id(p) in by_id}


def full_named_tensors(model: nn.Module, *, grads: bool = False) -> Iterator[tuple[str, torch.Tensor | None]]:
    """Yield ``(name, full tensor)`` for every parameter (or its gradient, with ``grads=True``).

    Split parameters are gathered from their group (a collective: every rank of the group must
    iterate to the end); replicated ones are returned as they are. Under
    ``data_parallel="fsdp"`` the data-parallel shards are gathered first. Names are the native model's.
    A parameter without a gradient yields ``None`` (on every rank alike, so no rank hangs).
    """
    specs = parameter_specs(reshard(model))
    for name, param in model.named_parameters():
        tensor = dp_full(param.grad if grads else param.detach())
        if name in specs:
            spec, group = specs[name]
            yield name, None if tensor is None else spec.gather(tensor, group)
        else:
            yield name, tensor
