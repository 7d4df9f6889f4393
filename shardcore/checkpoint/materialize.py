"""Meta materialization: swap loaded tensors in for meta ones, compute the buffers no checkpoint holds."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["checkpoint_policy", "materialize_buffers", "replace_tensors"]


def checkpoint_policy(model: nn.Module):
    info = getattr(model, "shardcore", None)
    if info is not None:
        return info.policy
    from ..policy import Policy

    policy = Policy()
    policy.set_model(model)
    return policy


def replace_tensors(model: nn.Module, replaced: dict[int, torch.Tensor]) -> None:
    """Swap every reference to a replaced (meta) tensor, so tied parameters stay tied."""
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) in replaced:
                module._parameters[name] = replaced[id(param)]
        for name, buf in list(module._buffers.items()):
            if buf is not None and id(buf) in replaced:
                module._buffers[name] = replaced[id(buf)]


def materialize_buffers(model: nn.Module, device) -> None:
    """Buffers still on meta (non-persistent ones, e.g. rotary frequencies) are computed by the model."""
    owners = [m for m in model.modules() if any(b is not None and b.is_meta for b in m._buffers.values())]
    if not owners:
        return
    for module in owners:
        for name, buf in list(module._buffers.items()):
            if buf is not None and buf.is_meta:
                module._buffers[name] = torch.empty_like(buf, device=device)
    checkpoint_policy(model).materialize_buffers(owners)
