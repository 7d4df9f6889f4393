"""Autograd collectives for tensor parallelism, apart from the modules that use them (public API).

Megatron-LM's names for the two conjugate operators of a tensor-parallel region:

* ``f`` = :func:`copy_to_tp`: identity forward, all-reduce of the gradient backward (entering a
  column-parallel region, whose every rank reads the whole input);
* ``g`` = :func:`reduce_from_tp`: all-reduce forward, identity backward (leaving a row-parallel
  region, whose ranks each hold a partial sum).

:func:`gather_from_tp` / :func:`split_to_tp` are the all-gather / keep-my-chunk pair used for
vocab-split logits and split inputs. Each function is the identity when its group has one rank, so a layer works unchanged at TP=1
and in a single process without ``torch.distributed``. Every collective issued here is counted
in :data:`COUNTS` (see :func:`count_collectives`), which is how tests prove the communication
budget of a layer.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
import torch.distributed as dist

__all__ = [
    "COUNTS",
    "copy_to_tp",
    "count_collectives",
    "enter_tp_region",
    "gather_from_tp",
    "group_rank",
    "group_size",
    "reduce_from_tp",
    "split_to_tp",
]

#: How many collectives of each kind this process has issued (forward and backward).
COUNTS: Counter[str] = Counter()


@contextlib.contextmanager
def count_collectives() -> Iterator[Counter[str]]:
    """Count the collectives issued inside the ``with`` block: ``{"all_reduce": n, ...}``."""
    before = COUNTS.copy()
    delta: Counter[str] = Counter()
    try:
        yield delta
    finally:
        delta.update(COUNTS)
        delta.subtract(before)
        for key in [k for k, n in delta.items() if n == 0]:
            del delta[key]


def group_size(group: dist.ProcessGroup | None) -> int:
    if group is None and not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    if group is None and not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce of a (contiguous) tensor; counted."""
    if group_size(group) > 1:
        COUNTS["all_reduce"] += 1
        dist.all_reduce(x, op=op, group=group)
    return x


def all_gather_cat(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """All-gather equal-shaped tensors and concatenate them along ``dim``; counted."""
    world = group_size(group)
    if world == 1:
        return x
    COUNTS["all_gather"] += 1
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def _local_chunk(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    world = group_size(group)
    if x.shape[dim] % world:
        raise ValueError(f"cannot split dimension {dim} of size {x.shape[dim]} into {world} equal parts")
    return x.chunk(world, dim=dim)[group_rank(group)].contiguous()


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``. Forward: identity. Backward: all-reduce (sum) of the gradient over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``. Forward: all-reduce (sum) over the group. Backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        if x.is_contiguous():  # reduce in place: x is a fresh partial sum nobody else reads
            ctx.mark_dirty(x)
            return all_reduce(x, group)
        return all_reduce(x.contiguous(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """Forward: all-gather, concatenated along ``dim``. Backward: keep this rank's chunk."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return all_gather_cat(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _local_chunk(grad, ctx.group, ctx.dim), None, None


class _SplitToTP(torch.autograd.Function):
    """Forward: keep this rank's chunk along ``dim``. Backward: all-gather the gradient."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _local_chunk(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_cat(grad, ctx.group, ctx.dim), None, None


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's ``f``: enter a tensor-parallel region: identity forward, all-reduce of the gradient backward."""
    return x if group_size(group) == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's ``g``: leave a tensor-parallel region by summing partial results: all-reduce forward only."""
    return x if group_size(group) == 1 else _ReduceFromTP.apply(x, group)


def gather_from_tp(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's slice along ``dim`` (all-gather); backward keeps the local slice."""
    return x if group_size(group) == 1 else _GatherFromTP.apply(x, group, dim % x.dim())


def split_to_tp(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """Keep this rank's equal slice along ``dim``; backward all-gathers the gradient."""
    return x if group_size(group) == 1 else _SplitToTP.apply(x, group, dim % x.dim())


def enter_tp_region(module: torch.nn.Module, group, arg: str = "hidden_states"):
    """Make ``module``'s input enter the tensor-parallel region (:func:`copy_to_tp`) once.

    The input is the keyword argument ``arg`` if given, else the first positional argument.
    Column-parallel layers inside ``module`` that read it are built with ``copy_input=False``.
    Returns the hook handle.
    """

    def hook(mod, args, kwargs):
        if arg in kwargs:
            kwargs = {**kwargs, arg: copy_to_tp(kwargs[arg], group)}
        elif args:
            args = (copy_to_tp(args[0], group), *args[1:])
        else:
            raise TypeError(f"{type(mod).__name__} was called without '{arg}' or a positional input")
        return args, kwargs

    return module.register_forward_pre_hook(hook, with_kwargs=True)
