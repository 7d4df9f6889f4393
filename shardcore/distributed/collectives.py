"""Bounded, counted collectives: every collective shardcore issues goes through here.

On gloo each waits at most the bound of its model's :class:`~shardcore.distributed.scope.Scope` (its
``ShardConfig(collective_timeout=...)``; outside any model, :func:`set_collective_timeout`) and then raises
:class:`CollectiveTimeout` (or :class:`CollectivePeerLost`) naming the collective, the module it
came from and the likely cause; on NCCL it never blocks the host: the stream waits, and the watch
(:mod:`shardcore.distributed.watch`) names a collective that outlives the bound; each is counted in :data:`COUNTS` (see :func:`count_collectives`),
which is how tests prove the communication budget of a layer. Each is the identity on a group
of one rank, so code using them runs unchanged in a single process without ``torch.distributed``.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import torch
import torch.distributed as dist

from .ranks import PaperGroup, global_rank, group_key, group_rank, group_ranks, group_size
from .retain import retain
from .scope import (
    COUNTS,
    DEFAULT_SCOPE,
    DEFAULT_TIMEOUT_S,
    TIMEOUT_ENV,
    CollectivePeerLost,
    CollectiveTimeout,
    Scope,
    Where,
    _count,
    _scope,
    _tagged,
    backward_of,
    count_collective_bytes,
    count_collectives,
    current_scope,
    enter_scope_per_forward,
    resolve_timeout,
    set_collective_timeout,
)
from .watch import WATCH, backend_of, blocks_host, group_device, watched

__all__ = [
    "COUNTS",
    "DEFAULT_SCOPE",
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "CollectivePeerLost",
    "CollectiveTimeout",
    "PaperGroup",
    "Pending",
    "Scope",
    "Where",
    "all_gather_cat",
    "all_reduce",
    "all_to_all_cat",
    "all_to_all_v",
    "backward_of",
    "broadcast",
    "count_collective_bytes",
    "count_collectives",
    "current_scope",
    "enter_scope_per_forward",
    "global_rank",
    "group_device",
    "group_key",
    "group_rank",
    "group_ranks",
    "group_size",
    "reduce_scatter_cat",
    "resolve_timeout",
    "set_collective_timeout",
    "start_all_gather",
    "start_reduce_scatter",
]


#: How many collectives of each kind this process has issued (forward and backward).
def _likely_cause(kind: str, seq: int, where: str, group, what: str, err: Exception | None = None) -> str:
    detail = f" ({err})" if err is not None else ""
    return (
        f"shardcore: {kind} #{seq} ({where}) {what} of its tensor-parallel group {group_ranks(group)}{detail}. "
        "Every rank of the tensor-parallel group must call the model the same number of times with the "
        "same shapes: a generate() or forward under `if rank == 0:` is the usual mistake (call it on "
        "every rank, print on one), or another rank failed or is stuck. The bound is "
        f"ShardConfig(collective_timeout=...) or {TIMEOUT_ENV}=<seconds>."
    )


#: what gloo / NCCL say when the other side of a collective went away
_PEER_GONE = ("connection closed by peer", "connection reset", "broken pipe", "remote worker", "socket closed")


def _wait_on_stream(work, device: torch.device, bound: float, cause) -> None:
    """NCCL's wait: the stream waits, the host goes on; the watch names it if it outlives ``bound``."""
    if not watched(device):
        work.wait()
        return
    entry = WATCH.enter(work, device, bound, cause)
    try:
        work.wait()  # a stream wait: with a timeout NCCL would block the host until it finishes
    except BaseException:
        WATCH.failed(entry)
        raise
    WATCH.on_stream(entry)


def _wait(work, kind: str, group, where: str | None, seq: int | None = None, *, device: torch.device) -> None:
    """Wait for an async collective. On gloo, on the host within the bound: past it raise
    :class:`CollectiveTimeout` saying which, and when a peer went away, :class:`CollectivePeerLost`
    with the same cause. On a watchdog backend (NCCL), on the stream only, the host never blocked:
    the :data:`~shardcore.distributed.watch.WATCH` names the collective if it outlives the bound."""
    scope = _scope(where)
    where = where or "forward of " + scope.module
    seq = scope.seq if seq is None else seq
    host_bound = scope.timeout_s if scope.timeout_s is not None and blocks_host(group, device) else None
    try:
        if host_bound is not None:
            work.wait(timeout=timedelta(seconds=host_bound))
        elif scope.timeout_s is not None:
            _wait_on_stream(work, device, scope.timeout_s, functools.partial(_likely_cause, kind, seq, where, group))
        else:
            work.wait()
        retain(work, group)  # no worker thread destroys it at the interpreter's exit (see .retain)
    except RuntimeError as err:
        text = str(err).lower()
        if "timed out" in text:  # the host bound, or (stream wait, no bound) the process group's own timeout
            bound = f"more than {host_bound:g} s" if host_bound else "past the process group's timeout"
            what = f"waited {bound} for the other ranks"
            raise CollectiveTimeout(_likely_cause(kind, seq, where, group, what, err)) from err
        if any(sign in text for sign in _PEER_GONE):
            what = "lost a peer (it left or gave up first) while waiting for the other ranks"
            raise CollectivePeerLost(_likely_cause(kind, seq, where, group, what, err)) from err
        if hasattr(err, "add_note"):  # another failure: say where, keep the error
            err.add_note(f"shardcore: while waiting in {kind} #{seq} ({where})")
        raise


def all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM, *, where: str | None = None) -> torch.Tensor:
    """In-place all-reduce of a (contiguous) tensor; counted, bounded (see :func:`set_collective_timeout`)."""
    if group_size(group) > 1:
        _count("all_reduce", where, x)
        _wait(dist.all_reduce(x, op=op, group=group, async_op=True), "all_reduce", group, where, device=x.device)
    return x


class Pending:
    """A collective started now (counted, async) and waited for later, within the bound:
    :meth:`wait` returns its result. What overlaps communication with computation is built on it."""

    def __init__(self, work, kind: str, group, where: str | None, result, device: torch.device | None = None) -> None:
        self.work, self.kind, self.group, self.result, self.device = work, kind, group, result, device
        scope = _scope(where)
        self.where, self.seq = _tagged(where or f"forward of {scope.module}", scope), scope.seq

    def wait(self):
        if self.work is not None:
            _wait(self.work, self.kind, self.group, self.where, self.seq, device=self.device)
            self.work = None
        return self.result()


def _tensor_collective(new: str, old: str):
    """The tensor collective (one flat buffer, no list of parts): ``*_single`` where PyTorch has it
    (2.14 deprecates the ``old`` names), ``old`` before. Looked up at each call, as every ``dist``
    function here (tests wrap them)."""
    return getattr(dist, new, None) or getattr(dist, old)


def _from_blocks(flat: torch.Tensor, world: int, dim: int) -> torch.Tensor:
    """``world`` equal blocks stacked along dimension 0 of ``flat``, concatenated along ``dim``
    instead (a view when ``dim`` is 0, else one copy: what ``torch.cat`` of the parts costs)."""
    if dim == 0:
        return flat
    blocks = flat.unflatten(0, (world, flat.shape[0] // world))
    return blocks.movedim(0, dim).flatten(dim, dim + 1)


def start_all_gather(x: torch.Tensor, group, dim: int, *, where: str | None = None) -> Pending:
    """Start the all-gather of equal-shaped tensors; ``wait()`` concatenates them along ``dim``
    (one tensor collective into a flat buffer; along dimension 0 the buffer is the result; on gloo,
    along another dimension, straight into the result's slices)."""
    world = group_size(group)
    if world == 1:
        return Pending(None, "all_gather", group, where, lambda: x)
    _count("all_gather", where, x)
    dim = dim % x.dim()
    x = x.contiguous()
    if dim and x.shape[:dim].numel() > 1 and backend_of(group, x.device) == "gloo":
        # gloo gathers into a list of parts whatever it is given: written straight into the result's
        # slices, the blocks need no reordering copy (128 MB of a Llama's logits at 4 x 1024 tokens)
        n = x.shape[dim]
        out = x.new_empty((*x.shape[:dim], world * n, *x.shape[dim + 1 :]))
        work = dist.all_gather([out.narrow(dim, r * n, n) for r in range(world)], x, group=group, async_op=True)
        return Pending(work, "all_gather", group, where, lambda: out, x.device)
    flat = x.new_empty((world * x.shape[0], *x.shape[1:]))
    work = _tensor_collective("all_gather_single", "all_gather_into_tensor")(flat, x, group=group, async_op=True)
    return Pending(work, "all_gather", group, where, lambda: _from_blocks(flat, world, dim), x.device)


def start_reduce_scatter(x: torch.Tensor, group, dim: int, *, where: str | None = None) -> Pending:
    """Start the reduce-scatter of ``x`` along ``dim``; ``wait()`` returns this rank's chunk of the sum
    (one tensor collective; along dimension 0 of a contiguous ``x`` no copy is made first)."""
    world = group_size(group)
    if world == 1:
        return Pending(None, "reduce_scatter", group, where, lambda: x)
    dim = dim % x.dim()
    if x.shape[dim] % world:
        raise ValueError(f"cannot reduce-scatter dimension {dim} of size {x.shape[dim]} over {world} ranks")
    _count("reduce_scatter", where, x)
    if dim == 0:
        flat = x.contiguous()
    else:  # the rank-ordered chunks along dim, stacked along dimension 0
        flat = x.unflatten(dim, (world, x.shape[dim] // world)).movedim(dim, 0).flatten(0, 1).contiguous()  # one copy
    out = flat.new_empty((flat.shape[0] // world, *flat.shape[1:]))
    scatter = _tensor_collective("reduce_scatter_single", "reduce_scatter_tensor")
    work = scatter(out, flat, group=group, async_op=True)
    return Pending(work, "reduce_scatter", group, where, lambda: out, x.device)  # the chunk's own shape


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
    _count("all_to_all", where, x)
    scatter, gather = scatter % x.dim(), gather % x.dim()
    send = x.unflatten(scatter, (world, x.shape[scatter] // world)).movedim(scatter, 0).contiguous()  # [rank, *chunk]
    received = torch.empty_like(send)
    work = dist.all_to_all_single(received, send, group=group, async_op=True)
    _wait(work, "all_to_all", group, where, device=x.device)
    return received.movedim(0, gather).flatten(gather, gather + 1)  # the ranks' chunks along ``gather``


def all_to_all_v(x: torch.Tensor, group, send: list[int], recv: list[int], *, where: str) -> torch.Tensor:
    """Rows ``x[sum(send[:i]) : sum(send[:i + 1])]`` to rank ``i``; returns the rows received, rank
    by rank (``recv[i]`` from rank ``i``): the all-to-all of unequal parts. Counted, bounded."""
    if group_size(group) == 1:
        return x
    _count("all_to_all", where, x)
    out = x.new_empty((sum(recv), *x.shape[1:]))
    work = dist.all_to_all_single(out, x.contiguous(), recv, send, group=group, async_op=True)
    _wait(work, "all_to_all", group, where, device=x.device)
    return out


def broadcast(x: torch.Tensor, group, *, where: str, src: int = 0) -> torch.Tensor:
    """In place, from rank ``src`` of the group (its first by default); counted, bounded."""
    if group_size(group) > 1:
        _count("broadcast", where, x)
        src = global_rank(group, src)
        _wait(dist.broadcast(x, src=src, group=group, async_op=True), "broadcast", group, where, device=x.device)
    return x
