"""Replicated parameters applied to split activations: each rank's gradient is its slice's share.

A weight every rank holds whole but applies only to its own part of a split activation (a norm
or a relative-position table shared by every head, applied to this rank's heads; LoRA's ``A``
under a row-parallel base) gets, on each rank, the gradient of that part alone. The unsharded
model's gradient is their sum: one all-reduce over the group in the backward, per parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from ..distributed.collectives import all_reduce, group_size

__all__ = ["sum_gradients_over_group", "sum_named_gradients", "summed_over"]


def summed_over(group, where: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gradient hook returning the gradient summed over ``group`` (``where`` names it in the bound's message)."""

    def hook(grad: torch.Tensor) -> torch.Tensor:
        return all_reduce(grad.contiguous().clone(), group, where=where)

    return hook


def sum_gradients_over_group(params: Mapping[str, nn.Parameter], group) -> None:
    """Make each of ``params``' gradients (``{name: parameter}``) the sum of the ranks' over ``group``."""
    for name, param in params.items():
        param.register_hook(summed_over(group, f"backward of {name} (gradient summed over the group)"))


def sum_named_gradients(model: nn.Module, names, group, who: str) -> None:
    """:func:`sum_gradients_over_group` for ``model``'s parameters ``names`` (a policy's
    :attr:`TensorParallelSpec.grad_sum <shardcore.spec.TensorParallelSpec>`; ``who`` names it in the error).
    Hooks only, no collective now; nothing over a group of one."""
    if not names or group is None or group_size(group) == 1:
        return
    params = dict(model.named_parameters(remove_duplicate=False))
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(
            f"{who}.tensor_parallel().grad_sum names {missing[:3]}, which {type(model).__name__} has no "
            "parameter of; name them as model.named_parameters() does"
        )
    sum_gradients_over_group({n: params[n] for n in names}, group)
