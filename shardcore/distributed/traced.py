"""The collectives ``torch.compile`` traces: torch's functional collectives, for code running inside
a compiled graph.

The bounded, counted collectives of :mod:`.collectives` wait on work handles from Python, count on
the host and name a late collective's layer: nothing a graph can hold, so Dynamo would break the
graph at each. While Dynamo traces (:func:`compiling`), the tensor-parallel mappings call these
instead: torch's functional collectives, which the graph records as ops (Inductor may then reorder
and overlap them with the matmuls around). What they give up, said where it shows: a collective in a
compiled graph is not in :data:`~shardcore.distributed.scope.COUNTS`, and its bound is the process
group's own timeout (NCCL's watchdog and flight recorder on GPUs), not shardcore's named one.
"""

from __future__ import annotations

import torch
from torch.distributed import _functional_collectives as funcol

__all__ = ["all_gather_cat", "all_reduce", "compiling"]


def compiling() -> bool:
    """Whether Dynamo is tracing the code running now (then a collective must be a graph op)."""
    return torch.compiler.is_compiling()


def all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """The sum of ``x`` over ``group``, out of place (a graph op)."""
    return funcol.all_reduce(x, "sum", group)


def all_gather_cat(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` (a graph op; ``*_single`` where torch has it)."""
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    return gather(x.contiguous(), dim % x.dim(), group)
