"""Test models whose parameters can show a bug: no parameter left at a constant its init gave it."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["without_constant_parameters"]


def without_constant_parameters(model: nn.Module, seed: int) -> nn.Module:
    """``model`` with every parameter that a fresh init leaves constant (a norm's weight of ones and
    bias of zeros, a zero bias) given small varied values, the same for the same ``seed``: a norm
    that is the identity hides a norm layer that drops its bias or its weight."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.numel() > 1 and param.device.type != "meta":
                flat = param.detach().reshape(-1)
                if bool((flat == flat[0]).all()):
                    # a tenth of the value (ones: 0.9-1.1), a hundredth around zero (a bias no larger
                    # than the weights' products, so it does not drown what they compute)
                    scale = 0.1 * max(abs(float(flat[0])), 0.1)
                    noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                    param.add_((scale * noise).to(param.dtype))
    return model
