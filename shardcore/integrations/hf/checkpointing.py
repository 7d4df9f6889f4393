"""HuggingFace's gradient checkpointing on a sharded model: the recompute sees what the forward did.

``model.gradient_checkpointing_enable()`` (or ``TrainingArguments(gradient_checkpointing=True)``)
gives each checkpointed module a ``_gradient_checkpointing_func`` (``torch.utils.checkpoint``
with the user's arguments), which its forward calls with the block's forward. Before each
training forward, :func:`carry_into_checkpoints` wraps that function (once; also when
checkpointing is switched on after :func:`shardcore.optimize`) so that every block it runs
carries shardcore's per-rank random streams and sequence split into its recompute
(:func:`~shardcore.tensor_parallel.recompute.carry_into_recompute`). The checkpoint itself,
reentrant or not, stays the user's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from torch import nn

from ...attach import attached
from ...tensor_parallel.recompute import Carried, carry_into_recompute, checkpointing

__all__ = ["carry_into_checkpoints"]


def carry_into_checkpoints(model: nn.Module, carried: Sequence[Carried]) -> None:
    """Wrap the checkpoint function of every module of ``model`` that has one, before each
    training forward that checkpoints, so its recomputes run with ``carried`` as the forward had it."""
    carried = tuple(carried)

    def wrap(module, args):
        if not checkpointing(module):
            return
        for sub in module.modules():
            func = sub.__dict__.get("_gradient_checkpointing_func")
            if func is not None and not getattr(func, "shardcore_carries", False):
                sub._gradient_checkpointing_func = _carrying(func, carried)

    attached(model).before_forward(
        model, "checkpointing", wrap, what="gradient checkpointing recomputes with the forward's random streams"
    )


def _carrying(checkpoint, carried: tuple[Carried, ...]):
    @functools.wraps(checkpoint)
    def run(function, *args, **kwargs):
        return checkpoint(carry_into_recompute(function, carried), *args, **kwargs)

    run.shardcore_carries = True
    return run
