"""Column- and row-parallel layers for ``Conv1D``-style linears, whose weight is stored ``[in, out]``.

Some libraries (GPT-2's ``Conv1D`` in transformers) keep a linear layer's weight transposed:
``y = x W + b`` with ``W`` of shape ``[in, out]``. These layers are :mod:`~shardcore.tensor_parallel.linear`'s
with that storage, so the split, the math and the communication are the same:

* :class:`Conv1D_Col` splits ``W`` along dim 1 (output features) and the bias along dim 0;
  backward all-reduces ``dL/dx`` once. :class:`FusedConv1D_Col` splits a packed ``[q; k; v]``
  output per head, each part on its own.
* :class:`Conv1D_Row` splits ``W`` along dim 0 (input features); one all-reduce forward.

Parameters keep the native ``[in, out]`` layout, so gathered tensors, gradients and saved
checkpoints have the library's own shapes. The native module is recognized structurally (a 2-D
``weight`` of shape ``[in, out]`` and a bias of size ``out``), so the core imports no model library.
"""

from __future__ import annotations

import torch
from torch import nn

from .linear import FusedLinear1D_Col, Linear1D_Col, Linear1D_Row

__all__ = ["Conv1D_Col", "Conv1D_Row", "FusedConv1D_Col"]


class FromConv1D:
    """Mixin: the native module holds ``weight`` as ``[in, out]`` and ``bias`` as ``[out]``."""

    transposed = True

    @classmethod
    def _native(cls, module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, int, int]:
        weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or isinstance(module, nn.Linear):
            raise TypeError(
                f"{cls.__name__}.from_native_module expects a Conv1D-style module with a 2-D [in, out] weight, "
                f"got {type(module).__name__}"
            )
        if bias is not None and bias.shape != (weight.shape[1],):
            raise TypeError(
                f"{cls.__name__}: {type(module).__name__}'s bias has shape {tuple(bias.shape)}, expected "
                f"({weight.shape[1]},) for an [in, out] weight of shape {tuple(weight.shape)}"
            )
        return weight, bias, weight.shape[0], weight.shape[1]


class Conv1D_Col(FromConv1D, Linear1D_Col):
    """Column-parallel ``[in, out]`` linear: output features split over the group."""


class FusedConv1D_Col(FromConv1D, FusedLinear1D_Col):
    """Column-parallel ``[in, out]`` linear with a packed output (``c_attn``'s ``[q; k; v]``), split per head."""


class Conv1D_Row(FromConv1D, Linear1D_Row):
    """Row-parallel ``[in, out]`` linear: input features split over the group."""
