"""A ``DistributedDataParallel`` put around a sharded model from outside (accelerate's ``prepare``, a
user's ``DDP(model)``): right where it can be, refused by name where it cannot.

DDP reads a module's ``_ddp_params_and_buffers_to_ignore`` (the names it leaves alone) first thing
in its constructor, before any collective. A sharded model sets it:

* **Tensor parallelism alone** (``dp == 1``, no pipeline, no ``data_parallel``): the split
  parameters' names. A DDP over the world (what accelerate's ``prepare`` builds) then averages the
  replicated parameters' gradients, which are equal on the ranks, and leaves each rank's slices
  alone; without the list it would broadcast rank 0's slices over the others' (same shapes: no
  error, wrong weights).
* **Anything else** (``data_parallel`` set, ``dp > 1``, pipeline stages): an ignore list whose
  reading raises, naming why and what to do. A second data-parallel wrapper around shardcore's own
  averages twice (and FSDP's sharded parameters break its broadcast); over ``dp > 1`` without
  shardcore's data parallelism the split parameters' gradients would never be averaged over the
  replicas; over pipeline stages the ranks hold different parameters.
"""

from __future__ import annotations

from torch import nn

from ..distributed import ParallelLayout

__all__ = ["OuterDDPRefused", "set_outer_ddp_ignore"]


class OuterDDPRefused:
    """What ``DistributedDataParallel`` finds as the ignore list of a model it cannot wrap: reading it
    raises ``RuntimeError`` with ``reason``."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason

    def __iter__(self):
        raise RuntimeError(
            f"DistributedDataParallel around a sharded {self.name} (accelerate's prepare(model) or DDP(model)): "
            f"{self.reason}. Leave the model as shardcore.optimize returned it (with accelerate: prepare the "
            "optimizer and scheduler only, accelerator.prepare(optimizer)); shardcore's data parallelism is "
            "ShardConfig(data_parallel='ddp' | 'fsdp' | 'zero2' | 'hsdp')"
        )

    def __repr__(self) -> str:
        return f"OuterDDPRefused({self.reason!r})"


def _refusal(data_parallel: str | None, layout: ParallelLayout) -> str | None:
    if data_parallel is not None:
        return f"its data parallelism is shardcore's already (data_parallel={data_parallel!r} over dp={layout.dp})"
    if layout.pp > 1:
        return f"its ranks hold different pipeline stages (pipeline_parallel_size={layout.pp})"
    if layout.dp > 1:
        return (
            f"dp={layout.dp} replicas without shardcore's data parallelism: the split parameters' gradients "
            "would not be averaged over them; set ShardConfig(data_parallel='ddp') instead"
        )
    return None


def set_outer_ddp_ignore(model: nn.Module, data_parallel: str | None, layout: ParallelLayout, split: list[str]) -> None:
    """Set ``model._ddp_params_and_buffers_to_ignore`` as the module's docstring says (``split``: the names of
    the split parameters)."""
    reason = _refusal(data_parallel, layout)
    if reason is not None:
        model._ddp_params_and_buffers_to_ignore = OuterDDPRefused(type(model).__name__, reason)
    elif split:
        model._ddp_params_and_buffers_to_ignore = sorted(split)
