"""Megatron-LM's autograd mappings for a tensor-parallel region.

* ``f`` = :func:`copy_to_tp`: identity forward, all-reduce of the gradient backward (entering a
  column-parallel region, whose every rank reads the whole input);
* ``g`` = :func:`reduce_from_tp`: all-reduce forward, identity backward (leaving a row-parallel
  region, whose ranks each hold a partial sum).

:func:`gather_from_tp` / :func:`split_to_tp` are the all-gather / keep-my-chunk pair used for
vocab-split logits and split inputs. Each is the identity when its group has one rank.

Each is traceable by ``torch.compile``: while Dynamo traces, their collectives are torch's
functional ones (:mod:`shardcore.distributed.traced`), so a compiled block holding parallel layers
is one graph, its collectives in it, not a graph broken at every tensor-parallel boundary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..distributed import traced
from ..distributed.collectives import all_gather_cat, all_reduce, backward_of, group_rank, group_size, start_all_gather
from .selective import selective_active


def _local_chunk(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    world = group_size(group)
    if x.shape[dim] % world:
        raise ValueError(f"cannot split dimension {dim} of size {x.shape[dim]} into {world} equal parts")
    return x.chunk(world, dim=dim)[group_rank(group)].contiguous()


def _alias(x: torch.Tensor) -> torch.Tensor:
    """The one op a copy into a region issues, fresh (:class:`_CopyToTP`) or shared (:func:`shared_copies`).

    Both issue it so that a block recomputed outside the forward's scope (activation checkpointing
    recomputes in backward, where each layer makes its own copy) runs the same ops, in the same
    order, as its forward did: torch's selective checkpointing finds each saved result by its op's
    count within the block, and a shared copy that issued nothing made every later view's count
    differ ("aten.view.default invocation index 14 ... not found in storage")."""
    return x.view_as(x)


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``. Forward: identity. Backward: all-reduce (sum) of the gradient over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.where = group, None if traced.compiling() else backward_of()
        return _alias(x)

    @staticmethod
    def backward(ctx, grad):
        if traced.compiling():
            return traced.all_reduce(grad, ctx.group), None
        return all_reduce(grad.contiguous().clone(), ctx.group, where=ctx.where), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``. Forward: all-reduce (sum) over the group. Backward: identity. In place
    only when the caller vouches that ``x`` is a partial sum it just computed and nobody else
    holds (``fresh``); otherwise into a copy, leaving ``x`` as it was."""

    @staticmethod
    def forward(ctx, x, group, fresh):
        if traced.compiling():  # out of place: a graph has no in-place collective on an input
            return traced.all_reduce(x, group)
        if fresh and x.is_contiguous() and not selective_active():  # a selective checkpoint keeps x
            ctx.mark_dirty(x)
            return all_reduce(x, group)
        return all_reduce(x.clone(memory_format=torch.contiguous_format), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _GatherFromTP(torch.autograd.Function):
    """Forward: all-gather, concatenated along ``dim``. Backward: keep this rank's chunk."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return traced.all_gather_cat(x, group, dim) if traced.compiling() else all_gather_cat(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _local_chunk(grad, ctx.group, ctx.dim), None, None


class _Gathered(torch.autograd.Function):
    """The result of an all-gather of ``x`` started earlier (:func:`start_gather_from_tp`), joined
    to ``x``'s graph. Backward: keep this rank's chunk, as :class:`_GatherFromTP`."""

    @staticmethod
    def forward(ctx, x, pending, group, dim):
        ctx.group, ctx.dim = group, dim
        return pending.wait()

    @staticmethod
    def backward(ctx, grad):
        return _local_chunk(grad, ctx.group, ctx.dim), None, None, None


class _SplitToTP(torch.autograd.Function):
    """Forward: keep this rank's chunk along ``dim``. Backward: all-gather the gradient."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim, ctx.where = group, dim, None if traced.compiling() else backward_of()
        return _local_chunk(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        if traced.compiling():
            return traced.all_gather_cat(grad, ctx.group, ctx.dim), None, None
        return all_gather_cat(grad, ctx.group, ctx.dim, where=ctx.where), None, None


#: Inside :func:`shared_copies`: ``{(id(x), id(group)): (x, copy)}`` of the forward running now.
_COPIES: list[dict] = []


@contextlib.contextmanager
def shared_copies() -> Iterator[None]:
    """Within the block (one forward), :func:`copy_to_tp` of one tensor returns one copy: layers
    reading the same input (q/k/v, gate/up) share one backward all-reduce of its gradient, which
    is exact (the all-reduce of a sum is the sum of the all-reduces)."""
    _COPIES.append({})
    try:
        yield
    finally:
        _COPIES.pop()


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's ``f``: enter a tensor-parallel region: identity forward, all-reduce of the gradient backward.

    The identity itself when no gradient can flow to ``x`` (it does not require one, or autograd
    is off): the backward all-reduce would never run, so nothing is recorded for it. Inside
    :func:`shared_copies`, one copy per tensor."""
    if group_size(group) == 1 or not (x.requires_grad and torch.is_grad_enabled()):
        return x
    if _COPIES and not traced.compiling():  # in a graph the compiler merges what it can itself
        key = (id(x), id(group))
        hit = _COPIES[-1].get(key)
        if hit is not None and hit[0] is x:
            return _alias(hit[1])  # the ops of a fresh copy: see _alias
        y = _CopyToTP.apply(x, group)
        _COPIES[-1][key] = (x, y)
        return y
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group, *, fresh: bool = False) -> torch.Tensor:
    """Megatron's ``g``: leave a tensor-parallel region by summing partial results: all-reduce forward only.

    ``fresh=True``: ``x`` was just computed by the caller and nothing else holds it, so it is summed
    in place (no copy); by default the sum goes to a new tensor and ``x`` is left as it was."""
    return x if group_size(group) == 1 else _ReduceFromTP.apply(x, group, fresh)


def gather_from_tp(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's slice along ``dim`` (all-gather); backward keeps the local slice."""
    return x if group_size(group) == 1 else _GatherFromTP.apply(x, group, dim % x.dim())


def start_gather_from_tp(x: torch.Tensor, group, dim: int = -1):
    """:func:`gather_from_tp` started now and finished by calling the returned function: what is
    computed from ``x`` meanwhile (a vocab-parallel loss on the logits) runs while it travels.
    ``x`` must not be changed in place before then. In a compiled graph, the gather itself (the
    compiler schedules it)."""
    dim = dim % x.dim()
    if group_size(group) == 1:
        return lambda: x
    if traced.compiling():
        gathered = _GatherFromTP.apply(x, group, dim)
        return lambda: gathered
    pending = start_all_gather(x.detach(), group, dim)
    return lambda: _Gathered.apply(x, pending, group, dim)


def split_to_tp(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """Keep this rank's equal slice along ``dim``; backward all-gathers the gradient."""
    return x if group_size(group) == 1 else _SplitToTP.apply(x, group, dim % x.dim())
