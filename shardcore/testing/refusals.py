"""Error-path checks: bad input must fail on every rank alike, and leave no rank waiting."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["refusal_message"]


def refusal_message(
    build: Callable[[], nn.Module],
    config=None,
    *,
    policy=None,
    seed: int = 0,
    errors: tuple[type[BaseException], ...] = (ValueError, RuntimeError, NotImplementedError, LookupError),
) -> str:
    """Shard ``build()`` expecting it to be refused; return the error message (``"no error"`` if
    none). Run on every rank: afterwards a barrier must complete, which proves no rank was left
    inside a collective. Compare the messages of all ranks in the test."""
    import torch.distributed as dist

    import shardcore

    torch.manual_seed(seed)
    try:
        shardcore.optimize(build(), config, policy=policy)
        message = "no error"
    except errors as exc:
        message = f"{type(exc).__name__}: {exc}"
    if dist.is_initialized():
        dist.barrier()  # every rank got here: nobody hangs in a collective
    return message
