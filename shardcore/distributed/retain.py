"""The last collectives' works of each group, kept for the rest of the process: a clean exit.

A run that finished could end in ``terminate called without an active exception`` (SIGABRT, about
2% of short gloo jobs under load; torchrun then reports the job failed). The cause is PyTorch's, shown
without shardcore (an all-gather whose Python tensors were dropped, a barrier, exit): a collective's
work is destroyed by whichever thread drops the last reference to it. After ``wait()`` returns, the
process group's worker thread (gloo's ``ProcessGroupGloo::runLoop``; NCCL's watchdog alike) still
holds the work until it resets its slot; when the Python handle is gone by then, the worker's reset
destroys it, and with it tensors whose Python objects the C++ side now owns, which needs the GIL.
If the main thread has meanwhile reached the interpreter's finalization, ``take_gil`` ends that
worker thread with ``pthread_exit``, whose forced unwind through a ``noexcept`` destructor
(``~AsyncAllgatherWork`` inside ``~AsyncBarrierWork``) is ``std::terminate``.

So every work shardcore waits for is kept here, the last :data:`KEEP` per group, in a container
that is never freed: the worker's reset is then never the last reference of a recent work (it needs
no GIL), an older one is released by the main thread (or by a worker during the run, when the GIL
comes back at the next wait), and at exit nothing the worker holds is destroyed at all. A bounded
number of works (their tensors: the last collectives' buffers) per group is the cost.

The script's own collectives and FSDP's (torch's, not shardcore's) are settled at exit: an ``atexit``
hook (run before the interpreter finalizes, while a worker can still take the GIL) issues one barrier
on each gloo group this rank is in, in the order the groups were made (the same on every rank), bounded
by :data:`EXIT_WAIT_S`, and keeps it: a barrier holds every work still in a worker's slot, so those
are kept too. Not after an uncaught exception (the other ranks may be anywhere), and not on NCCL
groups (never run here: their watchdog thread is torch's).
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import sys
from datetime import timedelta

import torch.distributed as dist

from .ranks import group_key

__all__ = ["EXIT_WAIT_S", "KEEP", "kept", "retain", "settle_at_exit"]

#: how long the exit barrier of a group waits for the other ranks before giving up (a rank gone early)
EXIT_WAIT_S = 10.0

#: works kept per group: the last ones, which a worker thread may not have released yet at exit
KEEP = 4
_KEPT: dict[tuple, collections.deque] = {}
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_KEPT))  # never freed: finalization drops none of these works


_AT_EXIT: list[bool] = []


def retain(work, group) -> None:
    """Keep ``work`` (waited for) as one of ``group``'s last :data:`KEEP`; the exit hook registered once."""
    if work is not None:
        _KEPT.setdefault(group_key(group), collections.deque(maxlen=KEEP)).append(work)
        if not _AT_EXIT:
            _AT_EXIT.append(True)
            atexit.register(settle_at_exit)


def _gloo_groups() -> list:
    """The gloo process groups this rank is in, in the order they were made (torch's own record)."""
    from .watch import backends

    try:
        groups = list(dist.distributed_c10d._world.pg_map)
    except AttributeError:  # another torch: the world alone
        groups = [dist.group.WORLD]
    return [g for g in groups if set(backends(g).values()) == {"gloo"}]


def settle_at_exit() -> int:
    """One kept barrier per gloo group (see the module docstring); how many completed."""
    if not (dist.is_available() and dist.is_initialized()) or getattr(sys, "last_value", None) is not None:
        return 0
    done = 0
    for group in _gloo_groups():
        try:
            work = dist.barrier(group=group, async_op=True)
            work.wait(timeout=timedelta(seconds=EXIT_WAIT_S))
        except Exception:  # a rank already gone: nothing more to settle with it
            return done
        retain(work, group)
        done += 1
    return done


def kept(group=None) -> int:
    """How many works of ``group`` are kept (at most :data:`KEEP`: the count never grows with the steps);
    ``None``: of every group together."""
    if group is None:
        return sum(len(works) for works in _KEPT.values())
    return len(_KEPT.get(group_key(group), ()))
