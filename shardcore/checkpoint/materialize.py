"""Meta materialization: swap loaded tensors in for meta ones, compute the buffers no checkpoint holds."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["checkpoint_names", "checkpoint_parts", "checkpoint_policy", "materialize_buffers", "replace_tensors"]


def checkpoint_policy(model: nn.Module):
    info = getattr(model, "shardcore", None)
    if info is not None:
        return info.policy
    from ..policy import Policy

    policy = Policy()
    policy.set_model(model)
    return policy


def checkpoint_names(model: nn.Module, names: list[str]) -> dict[str, str]:
    """``{model name: checkpoint name}`` for ``names`` the policy's checkpoint spec renames."""
    rename = checkpoint_policy(model).checkpoints().names
    return rename(names) if rename is not None else {}


def checkpoint_parts(model: nn.Module, names: list[str]) -> dict:
    """``{model name: StackedParts}`` for ``names`` the checkpoint keeps in pieces."""
    parts = checkpoint_policy(model).checkpoints().parts
    return parts(names) if parts is not None else {}


def _compute_buffers(model: nn.Module, policy, modules: list[nn.Module]) -> None:
    """The policy's :attr:`CheckpointSpec.materialize <shardcore.spec.CheckpointSpec>`, or the HuggingFace
    convention: ``model._init_weights(module)`` computes a module's buffers."""
    own = policy.checkpoints().materialize
    if own is not None:
        return own(modules)
    init = getattr(model, "_init_weights", None)
    if init is None:
        raise NotImplementedError(
            f"{type(policy).__name__} cannot compute the buffers of {[type(m).__name__ for m in modules]} after "
            "lazy initialization; declare CheckpointSpec(materialize=...) or build the model on a real device"
        )
    for module in modules:
        init(module)


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
    """Buffers still on meta (non-persistent ones, e.g. rotary frequencies) are computed by the model.

    The policy's :attr:`CheckpointSpec.materialize <shardcore.spec.CheckpointSpec>` runs twice, on buffers filled with
    0 and then with 1: a buffer whose result depends on that fill was not computed, and raises
    (never silently uninitialized memory)."""
    pending = [
        (module, name, buf)
        for module in model.modules()
        for name, buf in module._buffers.items()
        if buf is not None and buf.is_meta
    ]
    if not pending:
        return
    owners = list({id(m): m for m, _, _ in pending}.values())
    policy = checkpoint_policy(model)
    results = []
    for fill in (0, 1):
        for module, name, buf in pending:
            module._buffers[name] = torch.full(buf.shape, fill, dtype=buf.dtype, device=device)
        _compute_buffers(model, policy, owners)
        results.append([module._buffers[name].clone() for module, name, _ in pending])
    names = {id(m): n for n, m in model.named_modules()}
    unset = [
        f"{names[id(module)]}.{name}".lstrip(".")
        for (module, name, _), a, b in zip(pending, *results, strict=True)
        if not torch.equal(torch.nan_to_num(a.float()), torch.nan_to_num(b.float()))
    ]
    if unset:
        from .safetensors_io import CheckpointError

        raise CheckpointError(
            f"{type(model).__name__}: the buffers {unset} are not in the checkpoint and "
            f"{type(policy).__name__}'s checkpoint spec did not compute them after the meta "
            "build (older model-library versions compute them only in __init__); build the model under "
            "`with shardcore.init_empty():` instead of `with torch.device('meta'):` (parameters on meta, "
            "buffers computed as usual)"
        )
