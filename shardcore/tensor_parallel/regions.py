"""Entering and leaving a tensor-parallel region, with or without the sequence split.

:func:`enter_region` / :func:`leave_region` are Megatron's ``f`` / ``g`` when the forward is not
sequence-split, and the all-gather / reduce-scatter along the sequence when it is
(:class:`SequenceParallel`, see :mod:`shardcore.sequence`); :func:`linear_leave_region` overlaps a
row-parallel matmul with its reduce-scatter under ``enable_sequence_overlap``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from ..attach import attached
from ..distributed.collectives import (
    all_gather_cat,
    backward_of,
    group_rank,
    group_size,
    reduce_scatter_cat,
    start_all_gather,
    start_reduce_scatter,
)
from .mappings import _COPIES, copy_to_tp, reduce_from_tp, shared_copies

#: ``torch.compiler.disable`` (a graph break, the function run eagerly) in torch's own form that imports
#: ``torch._dynamo`` at the first call, not at ours: ``import shardcore`` costs no compiler
_eager = getattr(torch, "_disable_dynamo", None) or torch.compiler.disable


def enter_tp_region(module: torch.nn.Module, group, arg: str = "hidden_states", sequence=None):
    """Make ``module``'s input enter the tensor-parallel region (:func:`copy_to_tp`, or with
    ``sequence`` split, :func:`enter_region`'s all-gather) once.

    The input is the keyword argument ``arg`` if given, else the first positional argument.
    Column-parallel layers inside ``module`` that read it are built with ``copy_input=False``.
    Returns the hook handle.
    """

    def hook(mod, args, kwargs):
        if arg in kwargs:
            kwargs = {**kwargs, arg: enter_region(kwargs[arg], group, sequence)}
        elif args:
            args = (enter_region(args[0], group, sequence), *args[1:])
        else:
            raise TypeError(f"{type(mod).__name__} was called without '{arg}' or a positional input")
        return args, kwargs

    return module.register_forward_pre_hook(hook, with_kwargs=True)


@attrs.define(eq=False)
class SequenceParallel:
    """A model's sequence split over its tensor-parallel group (see :mod:`shardcore.sequence`):
    whether the forward running now is split along the sequence (``active``)."""

    group: Any
    size: int
    mode: str = "split_gather"
    dim: int = 1  # the sequence dimension of the hidden states
    active: bool = False
    #: ``{storage key of gathered: (weakref to it, this rank's slice)}`` of the forward running now: autograd
    #: saves the slice instead of the gathered tensor and gathers again in the backward
    gathered: dict = attrs.field(factory=dict)
    length: int = 0  # all_to_all / ring_attn: the whole sequence's length in the forward running now
    #: all_to_all: the blocks' keyword arguments split along the sequence, whole (the attention function's)
    whole: dict = attrs.field(factory=dict)
    attention_calls: int = 0  # all_to_all: the Ulysses attention calls of the forward running now
    #: ``enable_sequence_overlap``: row-parallel layers overlap their collectives with their matmuls
    #: (:func:`linear_leave_region`) and start gathering their region's saved input early in the backward
    overlap: bool = False
    #: the gathered input autograd saved last (what the next row-parallel layer's backward prefetches)
    latest_saved: Any = None
    #: the blocks are recomputed in the backward (activation checkpointing): their saved tensors are the
    #: checkpoint's to keep, not saved as slices (``gathered`` stays unused)
    checkpointing: bool = False
    #: ``ring_attn``: the sequence split in zigzag order (causal balance), else in contiguous parts
    zigzag: bool = True
    #: ``all_to_all``: what holds one value per query head (``SequenceSpec.per_head``): cut to this rank's heads
    per_head: tuple = ()

    def capture(self) -> tuple[bool, int]:
        """Whether the forward was split (when a checkpointed block starts): a
        :class:`~shardcore.tensor_parallel.recompute.Carried` for the block's recompute."""
        return self.active, self.attention_calls

    @contextlib.contextmanager
    def restore(self, token: tuple[bool, int]) -> Iterator[None]:
        live = self.active, self.attention_calls, self.checkpointing
        (self.active, self.attention_calls), self.checkpointing = token, True
        try:
            yield
        finally:
            self.active, self.attention_calls, self.checkpointing = live

    def dim_of(self, x: torch.Tensor) -> int:
        """The sequence dim of ``x``: :attr:`dim` of hidden states ``[batch, seq, ...]``; the rows of a
        2-D tensor whose tokens are flattened (an MoE block's shared MLP reads ``[tokens, hidden]``)."""
        return 0 if x.dim() == 2 else self.dim % x.dim()


def storage_key(t: torch.Tensor) -> tuple:
    """What identifies a tensor's memory: autograd may save a view of it (``F.linear`` saves its
    input flattened to 2-D). The storage itself, not its data pointer: a fake tensor's is 0, every one's
    (``FakeTensorMode``: the tracked rank of :mod:`shardcore.cost.tracked`), and every tensor saved would
    be taken for the gathered one."""
    return (t.untyped_storage()._cdata, t.dtype)


class _GatherSeq(torch.autograd.Function):
    """Entering a TP region from sequence-split activations: all-gather along the sequence
    forward; the input gradient (partial on each rank) reduce-scattered backward."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim, ctx.where = group, dim, backward_of()
        return all_gather_cat(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_cat(grad, ctx.group, ctx.dim, where=ctx.where), None, None


def gather_seq(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """All-gather along ``dim`` forward; the gradient (partial on each rank) reduce-scattered backward."""
    return _GatherSeq.apply(x, group, dim)


def scatter_seq(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """Partial sums reduce-scattered along ``dim`` forward; the gradient all-gathered backward."""
    return _ReduceScatterSeq.apply(x, group, dim)


class _ReduceScatterSeq(torch.autograd.Function):
    """Leaving a TP region into sequence-split activations: partial sums reduce-scattered along
    the sequence forward; the gradient all-gathered backward."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim, ctx.where = group, dim, backward_of()
        return reduce_scatter_cat(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_cat(grad.contiguous(), ctx.group, ctx.dim, where=ctx.where), None, None


#: Chunks a row-parallel layer's output features are cut into under ``enable_sequence_overlap``:
#: the reduce-scatter of one runs while the next one's matmul does.
OVERLAP_CHUNKS = 2


class _LinearScatterOverlap(torch.autograd.Function):
    """A row-parallel layer's matmul and its reduce-scatter along the sequence, overlapped: the
    output features in :data:`OVERLAP_CHUNKS` chunks, each chunk's reduce-scatter started as soon
    as its matmul ends. Backward: the gradient's all-gather runs while this rank's own tokens'
    input gradient is computed; the gathered input of the region (saved as a slice, see
    :mod:`shardcore.sequence`) starts gathering first, to be there when the backward reaches it."""

    @staticmethod
    def forward(ctx, x, weight, group, dim, prefetch):
        ctx.group, ctx.dim, ctx.prefetch, ctx.where = group, dim, prefetch, backward_of()
        ctx.save_for_backward(x, weight)
        pending = [start_reduce_scatter(F.linear(x, w), group, dim) for w in weight.chunk(OVERLAP_CHUNKS, dim=0)]
        return torch.cat([p.wait() for p in pending], dim=-1)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        group, dim = ctx.group, ctx.dim
        if ctx.prefetch is not None:
            ctx.prefetch.prefetch()
        gathering = start_all_gather(grad, group, dim, where=ctx.where)
        rank, world = group_rank(group), group_size(group)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        own = grad @ weight if need_x else None  # this rank's tokens' input gradient, while the others' arrive
        full = gathering.wait()
        grad_x = grad_w = None
        if need_x:
            parts = list(full.chunk(world, dim=dim))
            grad_x = torch.cat([own if j == rank else parts[j] @ weight for j in range(world)], dim=dim)
        if need_w:
            grad_w = full.reshape(-1, full.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return grad_x, grad_w, None, None, None


def linear_leave_region(x: torch.Tensor, weight: torch.Tensor, group, sequence: SequenceParallel | None = None):
    """``leave_region(F.linear(x, weight), ...)``; with the sequence split and ``sequence.overlap``,
    the matmul and the reduce-scatter overlapped (:class:`_LinearScatterOverlap`)."""
    if sequence is None or not (sequence.active and sequence.overlap) or group_size(group) == 1:
        return leave_region(F.linear(x, weight), group, sequence, fresh=True)  # our own matmul's output
    return _overlapped(x, weight, group, sequence)


@_eager  # the overlap's prefetch and saved-tensor bookkeeping run eagerly
def _overlapped(x: torch.Tensor, weight: torch.Tensor, group, sequence: SequenceParallel):
    prefetch, sequence.latest_saved = sequence.latest_saved, None
    return _LinearScatterOverlap.apply(x, weight, group, sequence.dim_of(x), prefetch)


def enter_region(x: torch.Tensor, group, sequence: SequenceParallel | None = None) -> torch.Tensor:
    """A tensor-parallel region's input: all-gathered along the sequence when the forward running
    now is sequence-split (backward: reduce-scatter), else :func:`copy_to_tp` (Megatron's *f*, which
    ``torch.compile`` traces). Within :func:`shared_copies`, one gather per tensor (q, k and v share it)."""
    if sequence is None or not sequence.active or group_size(group) == 1:
        return copy_to_tp(x, group)
    return _gather_sequence(x, group, sequence)


@_eager  # the sequence split's gathered-tensor bookkeeping (weak references) runs eagerly
def _gather_sequence(x: torch.Tensor, group, sequence: SequenceParallel) -> torch.Tensor:
    if _COPIES:
        key = (id(x), id(group), "sequence")
        hit = _COPIES[-1].get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
        y = _GatherSeq.apply(x, group, sequence.dim_of(x))
        _COPIES[-1][key] = (x, y)
    else:
        y = _GatherSeq.apply(x, group, sequence.dim_of(x))
    sequence.gathered[storage_key(y)] = (weakref.ref(y), x)
    return y


def leave_region(
    y: torch.Tensor, group, sequence: SequenceParallel | None = None, *, fresh: bool = False
) -> torch.Tensor:
    """A row-parallel layer's partial sums: reduce-scattered along the sequence when the forward is
    sequence-split (backward: all-gather), else :func:`reduce_from_tp` (Megatron's *g*; ``fresh``:
    see there; ``torch.compile`` traces it)."""
    if sequence is None or not sequence.active or group_size(group) == 1:
        return reduce_from_tp(y, group, fresh=fresh)
    return _scatter_sequence(y, group, sequence)


@_eager  # the sequence split's collectives run eagerly, bounded and counted
def _scatter_sequence(y: torch.Tensor, group, sequence: SequenceParallel) -> torch.Tensor:
    return _ReduceScatterSeq.apply(y, group, sequence.dim_of(y))


def share_copies_per_forward(model: torch.nn.Module) -> None:
    """Open a :func:`~shardcore.tensor_parallel.mappings.shared_copies` scope for each forward of ``model``."""
    scopes: list = []

    def enter(module, args):
        scope = shared_copies()
        scope.__enter__()
        scopes.append(scope)

    def leave(module, args, output):
        if scopes:
            scopes.pop().__exit__(None, None, None)

    attached(model).before_forward(model, "share_copies", enter, what="one copy per tensor for the column layers")
    attached(model).after_forward(model, "share_copies", leave, always=True)
