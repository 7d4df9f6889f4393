"""Selective activation checkpointing: keep what is costly to compute, recompute the rest.

Full activation checkpointing keeps a block's input only and runs its whole forward again in the
backward: about a third more compute for the least memory. Selective checkpointing (PyTorch's
``create_selective_checkpoint_contexts``, the op-level policy torchtitan and Megatron use) keeps
the outputs of the matmuls and of attention, which are most of a block's FLOPs, and recomputes the
cheap, memory-bound ops between them (norms, activations, residual adds, rotary): most of the
memory of the elementwise activations back for a few percent more compute. Collectives run again in
the recompute, each into the buffer the recompute allocates (as under full checkpointing); while a
selective checkpoint runs, a row-parallel layer's all-reduce sums into a copy, not into its matmul's
output in place, since the checkpoint keeps that output (the recompute would reduce it twice).
:func:`selective_checkpoint_context` is the ``context_fn`` of a non-reentrant checkpoint; through a
HuggingFace model's own checkpointing (which shardcore replays exactly, per-rank random streams
and sequence split included)::

    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": shardcore.selective_checkpoint_context()}
    )
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable

import torch

__all__ = ["SAVED_OPS", "selective_active", "selective_checkpoint_context"]


def _ops(*names: str) -> tuple:
    """The ATen overload packets of ``names`` this torch has."""
    return tuple(getattr(torch.ops.aten, n) for n in names if hasattr(torch.ops.aten, n))


#: how many selective checkpoints are running on this thread (forward or recompute): a reduction then
#: sums into a copy, never into its matmul's output in place (the checkpoint keeps that output)
_ACTIVE = threading.local()


def selective_active() -> bool:
    """Whether a selective checkpoint's forward or recompute is running on this thread."""
    return getattr(_ACTIVE, "depth", 0) > 0


@contextlib.contextmanager
def _marked(context):
    _ACTIVE.depth = getattr(_ACTIVE, "depth", 0) + 1
    try:
        with context:
            yield
    finally:
        _ACTIVE.depth -= 1


#: what each ``save`` name keeps: the outputs of these ops (every overload)
SAVED_OPS = {
    "matmul": _ops("mm", "addmm", "bmm", "baddbmm", "_scaled_mm"),
    "attention": _ops(
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ),
}


def _policy(saved: frozenset, counts: dict | None, ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    packet = getattr(op, "overloadpacket", op)
    keep = packet in saved
    if counts is not None:
        counts["save" if keep else "recompute"] = counts.get("save" if keep else "recompute", 0) + 1
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def selective_checkpoint_context(
    save: tuple[str, ...] = ("matmul", "attention"), counts: dict | None = None
) -> Callable:
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` that keeps
    the outputs of the ops named by ``save`` (:data:`SAVED_OPS`: ``"matmul"``, ``"attention"``) and
    recomputes every other op in the backward (see the module). ``counts``: a dict the policy adds each
    decision to (``"save"``, ``"recompute"``: how many ops it kept, how many the backward runs again)."""
    unknown = sorted(set(save) - set(SAVED_OPS))
    if unknown:
        raise ValueError(f"selective_checkpoint_context: unknown {unknown}; choose from {sorted(SAVED_OPS)}")
    saved = frozenset(op for name in save for op in SAVED_OPS[name])

    def context_fn():
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        # collectives run again in the recompute (as under full checkpointing), each into the buffer the
        # recompute allocates; nothing kept is reduced in place (mappings.py asks selective_active())
        forward, recompute = create_selective_checkpoint_contexts(functools.partial(_policy, saved, counts))
        return _marked(forward), _marked(recompute)

    return context_fn
