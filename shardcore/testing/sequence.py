"""Random streams under sequence parallelism: dropout on sequence-split activations must draw per
rank (each rank drops its own tokens) and replicated dropout must stay in step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..distributed.collectives import all_gather_cat

__all__ = ["dropout_patterns"]


def dropout_patterns(model: nn.Module, batch: Mapping[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    """Run ``model(**batch)`` in training mode once and report, for each submodule path in
    ``paths`` (dropout modules), the shape of its output on this rank and whether its zero pattern
    (what it dropped) is the same on every rank of the world: ``{"shapes": {...}, "same": {...}}``.
    Run on every rank."""
    seen: dict[str, torch.Tensor] = {}
    handles = [
        model.get_submodule(path).register_forward_hook(lambda m, a, out, path=path: seen.setdefault(path, out == 0))
        for path in paths
    ]
    try:
        model.train()(**batch)
    finally:
        for handle in handles:
            handle.remove()
    same = {}
    for path in paths:
        mask = seen[path].contiguous()
        masks = all_gather_cat(mask.unsqueeze(0), None, 0, where="the kit: each rank's mask")
        same[path] = all(torch.equal(m, masks[0]) for m in masks)
    return {"shapes": {path: tuple(seen[path].shape) for path in paths}, "same": same}
