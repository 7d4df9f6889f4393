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
import os
import weakref
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = [
    "COUNTS",
    "CollectiveTimeout",
    "PaperGroup",
    "SequenceParallel",
    "all_to_all_cat",
    "copy_to_tp",
    "count_collectives",
    "enter_region",
    "enter_tp_region",
    "gather_from_tp",
    "group_rank",
    "group_ranks",
    "group_size",
    "leave_region",
    "linear_leave_region",
    "reduce_from_tp",
    "reduce_scatter_cat",
    "set_collective_timeout",
    "split_to_tp",
    "start_gather_from_tp",
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


#: Default bound, in seconds, on how long one of shardcore's collectives waits for the other ranks.
DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_ENV = "SHARDCORE_COLLECTIVE_TIMEOUT"


class CollectiveTimeout(RuntimeError):
    """A shardcore collective waited longer than the bound for the other ranks of its group."""


class CollectivePeerLost(CollectiveTimeout):
    """A shardcore collective lost a peer while waiting (it exited, or its side of the transport
    closed): the same mistakes as a time-out, seen from the rank that stayed."""


class _Where:
    """Where this process's collectives come from: the parallel module last entered in forward
    (set by hooks :func:`shardcore.optimize` installs), a running sequence number, the bound."""

    module: str = "a shardcore collective outside any parallel module"
    seq: int = 0
    timeout_s: float | None = None


WHERE = _Where()


def resolve_timeout(seconds: float | None = None) -> float:
    """``seconds``, else ``$SHARDCORE_COLLECTIVE_TIMEOUT``, else :data:`DEFAULT_TIMEOUT_S`."""
    if seconds is not None:
        return float(seconds)
    value = os.environ.get(TIMEOUT_ENV)
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} must be a positive number of seconds")
    return seconds


def set_collective_timeout(seconds: float | None) -> None:
    """Bound every collective issued here (per process; ``None``: wait as long as the group does)."""
    WHERE.timeout_s = seconds


def _likely_cause(kind: str, seq: int, where: str, group, what: str, err: Exception) -> str:
    return (
        f"shardcore: {kind} #{seq} ({where}) {what} of its tensor-parallel group {group_ranks(group)} ({err}). "
        "Every rank of the tensor-parallel group must call the model the same number of times with the "
        "same shapes: a generate() or forward under `if rank == 0:` is the usual mistake (call it on "
        "every rank, print on one), or another rank failed or is stuck. The bound is "
        f"ShardConfig(collective_timeout=...) or {TIMEOUT_ENV}=<seconds>."
    )


#: what gloo / NCCL say when the other side of a collective went away
_PEER_GONE = ("connection closed by peer", "connection reset", "broken pipe", "remote worker", "socket closed")


def _wait(work, kind: str, group, where: str | None, seq: int | None = None) -> None:
    """Wait for an async collective; past the bound, raise :class:`CollectiveTimeout` saying which,
    and when a peer went away while waiting, :class:`CollectivePeerLost` with the same cause."""
    if WHERE.timeout_s is None:
        work.wait()
        return
    where = where or "forward of " + WHERE.module
    seq = WHERE.seq if seq is None else seq
    try:
        work.wait(timeout=timedelta(seconds=WHERE.timeout_s))
    except RuntimeError as err:
        text = str(err).lower()
        if "timed out" in text:
            what = f"waited more than {WHERE.timeout_s:g} s for the other ranks"
            raise CollectiveTimeout(_likely_cause(kind, seq, where, group, what, err)) from err
        if any(sign in text for sign in _PEER_GONE):
            what = "lost a peer (it left or gave up first) while waiting for the other ranks"
            raise CollectivePeerLost(_likely_cause(kind, seq, where, group, what, err)) from err
        if hasattr(err, "add_note"):  # another failure: say where, keep the error
            err.add_note(f"shardcore: while waiting in {kind} #{seq} ({where})")
        raise


def group_ranks(group: dist.ProcessGroup | None) -> list[int]:
    """The global ranks of ``group`` (``None``: the default group)."""
    return dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))


@attrs.frozen
class PaperGroup:
    """A tensor-parallel group that exists only on paper: this process plays ``rank`` of ``size``.

    Sharding a (meta-device) model with it computes the slices rank ``rank`` would hold, with no
    process group and no other process (``shardcore explain``); a collective on it is an error.
    """

    rank: int
    size: int


def group_size(group: dist.ProcessGroup | None) -> int:
    if isinstance(group, PaperGroup):
        return group.size
    if group is None and not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    if isinstance(group, PaperGroup):
        return group.rank
    if group is None and not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM, *, where: str | None = None) -> torch.Tensor:
    """In-place all-reduce of a (contiguous) tensor; counted, bounded (see :func:`set_collective_timeout`)."""
    if group_size(group) > 1:
        COUNTS["all_reduce"] += 1
        WHERE.seq += 1
        _wait(dist.all_reduce(x, op=op, group=group, async_op=True), "all_reduce", group, where)
    return x


class Pending:
    """A collective started now (counted, async) and waited for later, within the bound:
    :meth:`wait` returns its result. What overlaps communication with computation is built on it."""

    def __init__(self, work, kind: str, group, where: str | None, result) -> None:
        self.work, self.kind, self.group, self.result = work, kind, group, result
        self.where, self.seq = where or "forward of " + WHERE.module, WHERE.seq

    def wait(self):
        if self.work is not None:
            _wait(self.work, self.kind, self.group, self.where, self.seq)
            self.work = None
        return self.result()


def start_all_gather(x: torch.Tensor, group, dim: int, *, where: str | None = None) -> Pending:
    """Start the all-gather of equal-shaped tensors; ``wait()`` concatenates them along ``dim``."""
    world = group_size(group)
    if world == 1:
        return Pending(None, "all_gather", group, where, lambda: x)
    COUNTS["all_gather"] += 1
    WHERE.seq += 1
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    work = dist.all_gather(parts, x, group=group, async_op=True)
    return Pending(work, "all_gather", group, where, lambda: torch.cat(parts, dim=dim))


def start_reduce_scatter(x: torch.Tensor, group, dim: int, *, where: str | None = None) -> Pending:
    """Start the reduce-scatter of ``x`` along ``dim``; ``wait()`` returns this rank's chunk of the sum."""
    world = group_size(group)
    if world == 1:
        return Pending(None, "reduce_scatter", group, where, lambda: x)
    if x.shape[dim] % world:
        raise ValueError(f"cannot reduce-scatter dimension {dim} of size {x.shape[dim]} over {world} ranks")
    COUNTS["reduce_scatter"] += 1
    WHERE.seq += 1
    parts = [c.contiguous() for c in x.chunk(world, dim=dim)]
    out = torch.empty_like(parts[0])
    work = dist.reduce_scatter(out, parts, group=group, async_op=True)
    return Pending(work, "reduce_scatter", group, where, lambda: out)


def all_gather_cat(x: torch.Tensor, group, dim: int, *, where: str | None = None) -> torch.Tensor:
    """All-gather equal-shaped tensors and concatenate them along ``dim``; counted, bounded."""
    return start_all_gather(x, group, dim, where=where).wait()


def reduce_scatter_cat(x: torch.Tensor, group, dim: int, *, where: str | None = None) -> torch.Tensor:
    """This rank's equal chunk along ``dim`` of the sum over the group (reduce-scatter); counted, bounded."""
    return start_reduce_scatter(x, group, dim, where=where).wait()


def all_to_all_cat(x: torch.Tensor, group, scatter: int, gather: int, *, where: str | None = None) -> torch.Tensor:
    """Send the ``i``-th of ``x``'s equal chunks along ``scatter`` to rank ``i`` and concatenate the
    chunks received along ``gather`` (all-to-all); counted, bounded."""
    world = group_size(group)
    if world == 1:
        return x
    if x.shape[scatter] % world:
        raise ValueError(f"cannot split dimension {scatter} of size {x.shape[scatter]} over {world} ranks")
    COUNTS["all_to_all"] += 1
    WHERE.seq += 1
    inputs = [c.contiguous() for c in x.chunk(world, dim=scatter)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(world)]
    _wait(dist.all_to_all(outputs, inputs, group=group, async_op=True), "all_to_all", group, where)
    return torch.cat(outputs, dim=gather)


def broadcast(x: torch.Tensor, group, *, where: str) -> torch.Tensor:
    """In place, from the group's first rank; counted, bounded."""
    if group_size(group) > 1:
        COUNTS["broadcast"] += 1
        WHERE.seq += 1
        src = dist.get_global_rank(group, 0) if group is not None else 0
        _wait(dist.broadcast(x, src=src, group=group, async_op=True), "broadcast", group, where)
    return x


def _local_chunk(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    world = group_size(group)
    if x.shape[dim] % world:
        raise ValueError(f"cannot split dimension {dim} of size {x.shape[dim]} into {world} equal parts")
    return x.chunk(world, dim=dim)[group_rank(group)].contiguous()


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``. Forward: identity. Backward: all-reduce (sum) of the gradient over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.where = group, "backward of " + WHERE.module
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), ctx.group, where=ctx.where), None


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
        ctx.group, ctx.dim, ctx.where = group, dim, "backward of " + WHERE.module
        return _local_chunk(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_cat(grad, ctx.group, ctx.dim, where=ctx.where), None, None


# The four are never traced by torch.compile (ShardConfig(enable_jit_fused=True) compiles modules
# that hold parallel layers): a compiled graph breaks at them and they run eagerly.


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


@torch.compiler.disable
def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's ``f``: enter a tensor-parallel region: identity forward, all-reduce of the gradient backward.

    The identity itself when no gradient can flow to ``x`` (it does not require one, or autograd
    is off): the backward all-reduce would never run, so nothing is recorded for it. Inside
    :func:`shared_copies`, one copy per tensor."""
    if group_size(group) == 1 or not (x.requires_grad and torch.is_grad_enabled()):
        return x
    if _COPIES:
        key = (id(x), id(group))
        hit = _COPIES[-1].get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
        y = _CopyToTP.apply(x, group)
        _COPIES[-1][key] = (x, y)
        return y
    return _CopyToTP.apply(x, group)


@torch.compiler.disable
def reduce_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's ``g``: leave a tensor-parallel region by summing partial results: all-reduce forward only."""
    return x if group_size(group) == 1 else _ReduceFromTP.apply(x, group)


@torch.compiler.disable
def gather_from_tp(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's slice along ``dim`` (all-gather); backward keeps the local slice."""
    return x if group_size(group) == 1 else _GatherFromTP.apply(x, group, dim % x.dim())


@torch.compiler.disable
def start_gather_from_tp(x: torch.Tensor, group, dim: int = -1):
    """:func:`gather_from_tp` started now and finished by calling the returned function: what is
    computed from ``x`` meanwhile (a vocab-parallel loss on the logits) runs while it travels.
    ``x`` must not be changed in place before then."""
    dim = dim % x.dim()
    if group_size(group) == 1:
        return lambda: x
    pending = start_all_gather(x.detach(), group, dim)
    return lambda: _Gathered.apply(x, pending, group, dim)


def split_to_tp(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """Keep this rank's equal slice along ``dim``; backward all-gathers the gradient."""
    return x if group_size(group) == 1 else _SplitToTP.apply(x, group, dim % x.dim())


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
    attention_calls: int = 0  # all_to_all: the Ulysses attention calls of the forward running now
    #: ``enable_sequence_overlap``: row-parallel layers overlap their collectives with their matmuls
    #: (:func:`linear_leave_region`) and start gathering their region's saved input early in the backward
    overlap: bool = False
    #: the gathered input autograd saved last (what the next row-parallel layer's backward prefetches)
    latest_saved: Any = None


def _storage_key(t: torch.Tensor) -> tuple:
    """What identifies a tensor's memory: autograd may save a view of it (``F.linear`` saves its
    input flattened to 2-D)."""
    return (t.untyped_storage().data_ptr(), t.dtype)


class _GatherSeq(torch.autograd.Function):
    """Entering a TP region from sequence-split activations: all-gather along the sequence
    forward; the input gradient (partial on each rank) reduce-scattered backward."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim, ctx.where = group, dim, "backward of " + WHERE.module
        return all_gather_cat(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_cat(grad, ctx.group, ctx.dim, where=ctx.where), None, None


class _ReduceScatterSeq(torch.autograd.Function):
    """Leaving a TP region into sequence-split activations: partial sums reduce-scattered along
    the sequence forward; the gradient all-gathered backward."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim, ctx.where = group, dim, "backward of " + WHERE.module
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
        ctx.group, ctx.dim, ctx.prefetch, ctx.where = group, dim, prefetch, "backward of " + WHERE.module
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


@torch.compiler.disable
def linear_leave_region(x: torch.Tensor, weight: torch.Tensor, group, sequence: SequenceParallel | None = None):
    """``leave_region(F.linear(x, weight), ...)``; with the sequence split and ``sequence.overlap``,
    the matmul and the reduce-scatter overlapped (:class:`_LinearScatterOverlap`)."""
    if sequence is None or not (sequence.active and sequence.overlap) or group_size(group) == 1:
        return leave_region(F.linear(x, weight), group, sequence)
    prefetch, sequence.latest_saved = sequence.latest_saved, None
    return _LinearScatterOverlap.apply(x, weight, group, sequence.dim % x.dim(), prefetch)


@torch.compiler.disable
def enter_region(x: torch.Tensor, group, sequence: SequenceParallel | None = None) -> torch.Tensor:
    """A tensor-parallel region's input: all-gathered along the sequence when the forward running
    now is sequence-split (backward: reduce-scatter), else :func:`copy_to_tp` (Megatron's *f*).
    Within :func:`shared_copies`, one gather per tensor (q, k and v share it)."""
    if sequence is None or not sequence.active or group_size(group) == 1:
        return copy_to_tp(x, group)
    if _COPIES:
        key = (id(x), id(group), "sequence")
        hit = _COPIES[-1].get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
        y = _GatherSeq.apply(x, group, sequence.dim % x.dim())
        _COPIES[-1][key] = (x, y)
    else:
        y = _GatherSeq.apply(x, group, sequence.dim % x.dim())
    sequence.gathered[_storage_key(y)] = (weakref.ref(y), x)
    return y


@torch.compiler.disable
def leave_region(y: torch.Tensor, group, sequence: SequenceParallel | None = None) -> torch.Tensor:
    """A row-parallel layer's partial sums: reduce-scattered along the sequence when the forward is
    sequence-split (backward: all-gather), else :func:`reduce_from_tp` (Megatron's *g*)."""
    if sequence is None or not sequence.active or group_size(group) == 1:
        return reduce_from_tp(y, group)
    return _ReduceScatterSeq.apply(y, group, sequence.dim % y.dim())
