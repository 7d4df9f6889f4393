"""Normalization on fused kernels (``ShardConfig(enable_fused_normalization=True)``).

Both layers keep the native module's parameters (same objects, same names), so checkpoints,
ties and optimizers see no difference; only the kernel changes:

* :class:`FusedRMSNorm` replaces a model library's RMSNorm (``weight * x / rms(x)``, computed in
  fp32 and cast back, as HuggingFace's Llama/Mistral/Qwen2 norms do) with
  ``torch.nn.functional.rms_norm``: one fused kernel on CPU and CUDA instead of five elementwise ops.
* :class:`FusedLayerNorm` is an ``nn.LayerNorm`` that runs apex's fused kernel on CUDA when apex
  is installed; elsewhere torch's ``layer_norm``, which already is a single fused kernel.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FusedLayerNorm", "FusedRMSNorm"]


class FusedRMSNorm(nn.Module):
    """RMSNorm on ``torch.nn.functional.rms_norm``, holding the native module's ``weight``."""

    def __init__(self, weight: nn.Parameter, eps: float | None) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps
        self.normalized_shape = tuple(weight.shape)

    @classmethod
    def from_native_module(cls, module: nn.Module, process_group=None) -> FusedRMSNorm:
        weight = getattr(module, "weight", None)
        names = [n for n in ("variance_epsilon", "eps") if hasattr(module, n)]
        if not names or not isinstance(weight, nn.Parameter):
            raise TypeError(
                f"FusedRMSNorm replaces RMSNorms with a 'weight' parameter and 'variance_epsilon' or 'eps'; "
                f"{type(module).__name__} has {'no weight' if not isinstance(weight, nn.Parameter) else 'no eps'}"
            )
        eps = getattr(module, names[0])
        return cls(weight, None if eps is None else float(eps))  # None: torch's default (dtype's eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        # lower precision: normalize in fp32, cast back, then scale (the native modules' order)
        return self.weight * F.rms_norm(x.float(), self.normalized_shape, None, self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, kernel=torch.nn.functional.rms_norm"


@functools.cache
def _apex_layer_norm():
    try:
        from apex.normalization.fused_layer_norm import fused_layer_norm_affine
    except Exception:  # apex absent or built without its CUDA extension
        return None
    return fused_layer_norm_affine


class FusedLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` holding the native module's parameters, on apex's kernel where it runs."""

    @classmethod
    def from_native_module(cls, module: nn.LayerNorm, process_group=None) -> FusedLayerNorm:
        if not isinstance(module, nn.LayerNorm):
            raise TypeError(f"FusedLayerNorm replaces torch.nn.LayerNorm, got {type(module).__name__}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.normalized_shape, new.eps = module.normalized_shape, module.eps
        new.elementwise_affine = module.elementwise_affine
        new.weight, new.bias = module.weight, module.bias  # the same Parameter objects (or None)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        apex = _apex_layer_norm() if x.is_cuda and self.weight is not None and self.bias is not None else None
        if apex is not None:
            return apex(x, self.weight, self.bias, self.normalized_shape, self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
