"""Error-path checks: bad input must fail on every rank alike, before any collective, leaving no rank waiting."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator

import torch
from torch import nn

from ..distributed.objects import barrier

__all__ = ["count_c10d_calls", "rank_zero_only", "refusal_message"]

#: ``torch.distributed`` calls that need the other ranks (collectives, point-to-point, group creation).
C10D_CALLS = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "split_group",
)


@contextlib.contextmanager
def count_c10d_calls() -> Iterator[Counter[str]]:
    """Count the ``torch.distributed`` calls that involve other ranks made inside the block, from
    any code (shardcore's, DeviceMesh's): ``{"all_gather": 1, "new_group": 2, ...}``. Observed by a
    profile function that knows the functions' code objects (this thread's calls; nothing of torch
    is replaced); a call made by another of them (an object collective's all-gather) counts too."""
    import inspect

    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.distributed_c10d as c10d

    codes = {}
    for module in (dist, c10d, device_mesh):
        for name in C10D_CALLS:
            function = inspect.unwrap(getattr(module, name, None) or (lambda: None))
            if getattr(function, "__module__", "").startswith("torch.distributed"):
                codes[function.__code__] = name
    counts: Counter[str] = Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            counts[codes[frame.f_code]] += 1

    saved = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(saved)


def refusal_message(
    build: Callable[[], nn.Module],
    config=None,
    *,
    policy=None,
    seed: int = 0,
    errors: tuple[type[BaseException], ...] = (ValueError, RuntimeError, NotImplementedError, LookupError),
    collectives_allowed: bool = False,
) -> str:
    """Shard ``build()`` expecting it to be refused; return the error message (``"no error"`` if
    none). Run on every rank; compare the messages of all ranks in the test.

    The refusal must come before any call that needs the other ranks (counted with
    :func:`count_c10d_calls`), or a rank that raised would leave the others waiting; pass
    ``collectives_allowed=True`` for errors that can only be found together (ranks holding
    different weights). Afterwards a barrier must complete: no rank was left in a collective.
    """
    import torch.distributed as dist

    import shardcore

    torch.manual_seed(seed)
    model = build()
    with count_c10d_calls() as calls:
        try:
            shardcore.optimize(model, config, policy=policy)
            message = "no error"
        except errors as exc:
            message = f"{type(exc).__name__}: {exc}"
    if dist.is_initialized():
        barrier(where="the kit: after the refusal")  # every rank got here: nobody hangs in a collective
    if message != "no error" and calls and not collectives_allowed:
        raise AssertionError(f"refused only after {dict(calls)} calls to other ranks: {message}")
    return message


def _on_rank_zero_only(prepare: Callable, args: tuple) -> str:
    """Every rank runs ``prepare(*args)``; only rank 0 makes the call it returns, rank 1 waits in a
    barrier nobody matches (the user's ``if rank == 0:``)."""
    import time

    import torch.distributed as dist

    from ..distributed.collectives import CollectiveTimeout

    call = prepare(*args)
    if dist.get_rank() == 0:
        start = time.monotonic()
        try:
            call()
        except CollectiveTimeout as err:  # or its sibling CollectivePeerLost
            return f"{time.monotonic() - start:.1f} {type(err).__name__}: {err}"
        return "0 returned without an error"
    try:
        barrier(where="the kit: the rank the user's call left out")
    except RuntimeError as err:  # the group's own timeout
        return f"barrier: {err}"
    return "barrier returned"


def rank_zero_only(prepare: Callable, *args, group_timeout_s: float = 5) -> tuple[float, str, str]:
    """Run the mistake ``if rank == 0: call()`` on 2 fresh gloo ranks: ``prepare(*args)`` (a
    module-level function, run on every rank) builds what is needed and returns the call. Returns
    ``(seconds rank 0 waited, rank 0's error as "Type: message", what rank 1 saw)``; the pool is
    closed after (its group ends broken). Give the model a ``collective_timeout`` shorter than
    ``group_timeout_s``: rank 0 then raises :class:`~shardcore.CollectiveTimeout`, or
    :class:`~shardcore.CollectivePeerLost` when rank 1's barrier gave up first on a loaded machine
    (the same named cause either way)."""
    from ..distributed import RankPool

    # the pool's own deadline far past the group's: on a loaded machine building the model takes
    # longer, and the bound under test must end rank 0's wait, named, before the harness gives up
    pool = RankPool(2, timeout_s=group_timeout_s, call_timeout=max(300.0, 20 * group_timeout_s))
    try:
        mine, other = pool.run(_on_rank_zero_only, prepare, args)
    finally:
        pool.close(force=True)
    seconds, _, message = mine.partition(" ")
    return float(seconds), message, other
