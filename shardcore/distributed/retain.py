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
"""

from __future__ import annotations

import collections
import ctypes

from .ranks import group_key

__all__ = ["KEEP", "kept", "retain"]

#: works kept per group: the last ones, which a worker thread may not have released yet at exit
KEEP = 4
_KEPT: dict[tuple, collections.deque] = {}
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_KEPT))  # never freed: finalization drops none of these works


def retain(work, group) -> None:
    """Keep ``work`` (waited for) as one of ``group``'s last :data:`KEEP`."""
    if work is not None:
        _KEPT.setdefault(group_key(group), collections.deque(maxlen=KEEP)).append(work)


def kept(group) -> int:
    """How many works of ``group`` are kept (at most :data:`KEEP`: the count never grows with the steps)."""
    return len(_KEPT.get(group_key(group), ()))
