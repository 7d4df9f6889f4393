"""Error-path checks: bad input must fail on every rank alike, before any collective, leaving no rank waiting."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

import torch
from torch import nn

__all__ = ["count_c10d_calls", "refusal_message"]

#: ``torch.distributed`` calls that need the other ranks (collectives, point-to-point, group creation).
C10D_CALLS = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
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
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "split_group",
)


@contextlib.contextmanager
def count_c10d_calls() -> Iterator[Counter[str]]:
    """Count the ``torch.distributed`` calls that involve other ranks made inside the block, from
    any code (shardcore's, DeviceMesh's): ``{"all_gather": 1, "new_group": 2, ...}``. The
    functions are wrapped where they are looked up (``torch.distributed``, its ``distributed_c10d``
    and ``device_mesh`` modules) and restored afterwards."""
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.distributed_c10d as c10d

    counts: Counter[str] = Counter()
    saved = []
    for module in (dist, c10d, device_mesh):
        for name in C10D_CALLS:
            original = getattr(module, name, None)
            if original is None:
                continue

            def counted(*args, __name=name, __original=original, **kwargs):
                counts[__name] += 1
                return __original(*args, **kwargs)

            saved.append((module, name, original))
            setattr(module, name, counted)
    try:
        yield counts
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


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
        dist.barrier()  # every rank got here: nobody hangs in a collective
    if message != "no error" and calls and not collectives_allowed:
        raise AssertionError(f"refused only after {dict(calls)} calls to other ranks: {message}")
    return message
