"""The check at the first backward: every replicated parameter's gradient compared across the group."""

from __future__ import annotations

import torch
from torch import nn

from ..distributed.collectives import all_gather_cat, group_size
from .errors import ShardingCheckError
from .probe import _device

__all__ = ["check_first_backward"]


def check_first_backward(model: nn.Module, group, name: str) -> None:
    """At the end of the model's first backward, compare every replicated parameter's gradient across
    ``group`` (see the module docstring); the hooks then go."""
    from ..sharded_state import parameter_specs

    split = set(parameter_specs(model))
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and n not in split]
    if not params or group_size(group) == 1:
        return
    handles: list = []
    state = {"queued": False}

    def check() -> None:
        for h in handles:
            h.remove()
        zero = torch.zeros(2, dtype=torch.float64, device=_device(model))
        local = torch.stack(
            [
                zero if p.grad is None else torch.stack([p.grad.double().sum(), p.grad.double().abs().sum()])
                for _, p in params
            ]
        ).unsqueeze(0)
        every = all_gather_cat(local, group, 0, where="the first-step gradient check")
        scale = every[..., 1].abs().amax(dim=0).clamp_min(1e-12)
        spread = (every - every[:1]).abs().amax(dim=0).amax(dim=-1) / scale
        bad = [params[i][0] for i in torch.nonzero(spread > 1e-4).flatten().tolist()]
        if bad:
            raise ShardingCheckError(
                f"{name}: at the first backward the gradients of {', '.join(bad[:8])}"
                f"{f' (and {len(bad) - 8} more)' if len(bad) > 8 else ''} differ across the tensor-parallel ranks: "
                "they are replicated but used on split activations, so each rank holds its share only. "
                "Give them the spec replicated_with_grad_allreduce in the plan (their gradients are then summed), "
                "or split the modules around them differently"
            )

    def on_grad(param) -> None:
        if not state["queued"]:
            state["queued"] = True
            torch.autograd.Variable._execution_engine.queue_callback(check)

    handles += [p.register_post_accumulate_grad_hook(on_grad) for _, p in params]
