"""What a block recomputed by activation checkpointing must see as its forward did.

A checkpoint runs a block's forward twice: in the forward (keeping no activations) and again in
the backward, to get them back. PyTorch replays the default random stream; what shardcore adds
must be replayed too, or the recompute computes other numbers than the forward and the gradients
are silently wrong: the per-rank random streams (:data:`~shardcore.tensor_parallel.rng.STREAMS`:
dropout on this rank's heads) and the sequence split of the forward
(:class:`~shardcore.tensor_parallel.regions.SequenceParallel`: whether it was split).
:func:`carry_into_recompute` wraps the function a checkpoint runs; the HuggingFace integration
wraps the models' own checkpoint function with it
(:func:`shardcore.integrations.hf.checkpointing.carry_into_checkpoints`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from torch import nn

__all__ = ["Carried", "carry_into_recompute", "checkpointing"]


class Carried(Protocol):
    """State a recompute must see as the forward did."""

    def capture(self) -> Any:
        """The state now (when a checkpointed block's forward starts)."""

    def restore(self, token: Any) -> contextlib.AbstractContextManager:
        """A context in which the state is ``token`` again; the live state comes back at its exit."""


def carry_into_recompute(function: Callable, carried: Sequence[Carried]) -> Callable:
    """``function`` for a checkpoint: its first call (the forward) records each of ``carried``;
    every later call (a recompute in the backward) runs with what was recorded."""
    tokens: list | None = None

    @functools.wraps(function)
    def run(*args, **kwargs):
        nonlocal tokens
        if tokens is None:
            tokens = [state.capture() for state in carried]
            return _rerun(function, args, kwargs)
        with contextlib.ExitStack() as stack:
            for state, token in zip(carried, tokens, strict=True):
                stack.enter_context(state.restore(token))
            return _rerun(function, args, kwargs)

    return run


def _rerun(function: Callable, args: tuple, kwargs: dict):
    """``function`` (the forward, or a recompute), between the hooks the block it is the ``forward`` of keeps
    for its checkpoint (HuggingFace's ``partial(forward, block)``, the block's own hooks outside the checkpoint;
    ``block._shardcore_recompute``: ``(pre-hook, hook)``, a sequence split's sums of its weights' gradients)."""
    owner = function.args[0] if isinstance(function, functools.partial) and function.args else None
    hooks = getattr(owner, "__dict__", {}).get("_shardcore_recompute")
    if hooks is None:
        return function(*args, **kwargs)
    enter, leave = hooks
    enter(owner, ())
    output = None
    try:
        output = function(*args, **kwargs)
    finally:
        changed = leave(owner, (), output)
    return output if changed is None else changed


def checkpointing(model: nn.Module) -> bool:
    """Whether ``model`` (a HuggingFace model) recomputes its blocks in this training forward."""
    name = "is_activation_checkpointing"  # transformers 5 (is_gradient_checkpointing: 4.x, deprecated in 5)
    flag = getattr(model, name if hasattr(type(model), name) else "is_gradient_checkpointing", False)
    return bool(model.training and flag)
