"""An RMSNorm over a dimension split across the group: the norm of a column-parallel output
(OLMoE's and OLMo 2's ``q_norm`` / ``k_norm`` normalize the projected queries over every head)."""

from __future__ import annotations

import torch
from torch import nn

from ..distributed.collectives import all_reduce
from .parallel_module import ParallelModule
from .shard_spec import ShardSpec

__all__ = ["SplitRMSNorm"]


class _SumEverywhere(torch.autograd.Function):
    """A sum over the group that every rank goes on using: all-reduce forward, and backward (each
    rank's gradient of the sum is its own use's share)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_reduce(x.clone(), group, where="split RMSNorm: sum of squares")

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), ctx.group, where="backward of split RMSNorm"), None


class SplitRMSNorm(ParallelModule):
    """``weight * x / sqrt(mean(x^2) + eps)`` over a last dimension split evenly over the group
    (this rank's ``x`` and ``weight`` are its slice, as the column-parallel layer before it split
    its output): the sum of squares is summed over the group, the rest is per rank; computed in
    float32 and cast back before the weight, as HuggingFace's RMSNorms do."""

    @classmethod
    def from_native_module(cls, module: nn.Module, process_group=None, **kwargs) -> SplitRMSNorm:
        weight = getattr(module, "weight", None)
        eps = next((getattr(module, n) for n in ("variance_epsilon", "eps") if hasattr(module, n)), None)
        if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or eps is None:
            raise TypeError(
                f"SplitRMSNorm replaces RMSNorms with a 1-D 'weight' and 'variance_epsilon' or 'eps'; got "
                f"{type(module).__name__}"
            )
        new = cls(process_group)
        new._shard_param("weight", weight, ShardSpec.even(weight.shape[0], new.tp_size, what="normalized dimension"))
        new.eps, new.full_size = float(eps), weight.shape[0]
        return new

    def collectives(self) -> dict[str, list[str]]:
        return {"forward": ["all_reduce"], "backward": ["all_reduce"]}

    def collective_bytes(self, tokens: int, itemsize: int) -> dict[str, list[int]]:
        return {"forward": [tokens * 4], "backward": [tokens * 4]}  # a float32 sum of squares per token

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        squares = _SumEverywhere.apply(x32.pow(2).sum(-1, keepdim=True), self.process_group)
        return self.weight * (x32 * torch.rsqrt(squares / self.full_size + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.full_size} split over {self.tp_size}, eps={self.eps}"
