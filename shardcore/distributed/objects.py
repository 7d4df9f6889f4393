"""Point-to-point sends, picklable objects and barriers: the rest of what shardcore says to other ranks,
through the same counted door as :mod:`~shardcore.distributed.collectives`.

A tensor sent or received waits within its scope's bound like any collective (on gloo) or on the
stream (NCCL); an object collective or a barrier blocks the host by its nature (PyTorch pickles the
object into a tensor on the group's device), is counted, and is told to the audits
(:mod:`shardcore.distributed.audit`). Outside this package no module calls ``torch.distributed``'s
communication directly (``tests/test_core_seams.py`` holds the line).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from . import audit
from .collectives import _wait
from .ranks import global_rank, group_rank, group_size
from .retain import retain
from .scope import _count

__all__ = [
    "all_gather_object",
    "barrier",
    "broadcast_object",
    "recv",
    "recv_object",
    "send",
    "send_object",
    "swap",
]


def send(x: torch.Tensor, peer: int, group, *, where: str) -> None:
    """Send ``x`` to rank ``peer`` of ``group`` (its rank in the group); counted, bounded."""
    _count("send", where, x)
    work = dist.isend(x.contiguous(), dst=global_rank(group, peer), group=group)
    _wait(work, "send", group, where, device=x.device)


def recv(x: torch.Tensor, peer: int, group, *, where: str) -> torch.Tensor:
    """Receive into ``x`` from rank ``peer`` of ``group``; counted, bounded."""
    _count("recv", where, x)
    _wait(dist.irecv(x, src=global_rank(group, peer), group=group), "recv", group, where, device=x.device)
    return x


def swap(x: torch.Tensor, out: torch.Tensor, peer: int, group=None, *, where: str) -> torch.Tensor:
    """Send ``x`` to rank ``peer`` of ``group`` and receive its tensor into ``out`` at once (a pairwise
    exchange, both directions in flight together); counted as a send, bounded."""
    _count("send", where, x)
    ops = [dist.P2POp(dist.isend, x.contiguous(), global_rank(group, peer), group)]
    ops.append(dist.P2POp(dist.irecv, out, global_rank(group, peer), group))
    for work in dist.batch_isend_irecv(ops):
        _wait(work, "send", group, where, device=x.device)
    return out


def _blocking(kind: str, where: str) -> None:
    _count(kind, where)
    audit.host_sync(kind)


def all_gather_object(obj: Any, group=None, *, where: str) -> list:
    """Every rank's ``obj``, in the group's rank order (blocks the host; counted)."""
    world = group_size(group)
    if world == 1:
        return [obj]
    _blocking("all_gather_object", where)
    out: list = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def broadcast_object(obj: Any, src: int, group=None, *, where: str) -> Any:
    """Rank ``src``'s ``obj`` (its rank in ``group``) on every rank (blocks the host; counted)."""
    if group_size(group) == 1:
        return obj
    _blocking("broadcast_object", where)
    box = [obj if group_rank(group) == src else None]
    dist.broadcast_object_list(box, src=global_rank(group, src), group=group)
    return box[0]


def send_object(obj: Any, peer: int, group, *, where: str) -> None:
    """Send a picklable ``obj`` to rank ``peer`` of ``group`` (blocks the host; counted)."""
    _blocking("send_object", where)
    dist.send_object_list([obj], dst=global_rank(group, peer), group=group)


def recv_object(peer: int, group, *, where: str) -> Any:
    """The object rank ``peer`` of ``group`` sent (blocks the host; counted)."""
    _blocking("recv_object", where)
    box: list = [None]
    dist.recv_object_list(box, src=global_rank(group, peer), group=group)
    return box[0]


def barrier(group=None, *, where: str) -> None:
    """Wait until every rank of ``group`` got here (blocks the host; counted)."""
    if group_size(group) > 1:
        _blocking("barrier", where)
        work = dist.barrier(group=group, async_op=True)
        work.wait()
        retain(work, group)  # with the works it waited for: no worker thread destroys them at exit (.retain)
