"""A pipeline rank of a simulated world (:mod:`shardcore.distributed.simulate`): its stages' shapes.

``torch.distributed.pipelining`` learns what a stage receives from the stage before it (the
shapes travel ahead of the first microbatch); on the fake backend nothing travels, and torch asks
for each stage's inputs and outputs up front. This rank has every block before the stages are
pruned, so it runs the stages' own forward (the policy's :attr:`~shardcore.spec.PipelineSpec.stage_forward`)
once, without gradients, on one microbatch of ``ShardConfig(example_inputs=batch)`` (the batch as
:func:`~shardcore.pipeline_step` takes it), stage after stage, and keeps the shapes on the meta
device. Each stage's output has the shape it would have with only its own blocks: a block leaves
the hidden states' shape as it found them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..distributed.simulate import is_simulated

__all__ = ["check_simulated_shapes", "stage_shapes"]


def stage_shapes(spec, config, num_stages: int, group) -> tuple[dict[int, dict], tuple | None]:
    """``({stage: {"input_args": ..., "output_args": ...}}, the batch's input shapes)`` (meta tensors)
    for a pipeline on the fake backend; ``({}, None)`` on a real one (the stages tell each other)."""
    if not is_simulated(group):
        return {}, None
    example = config.example_inputs
    if not isinstance(example, Mapping):
        raise ValueError(
            "a simulated pipeline rank (the fake process-group backend) cannot learn its stage's input shapes from "
            "the stage before it: pass ShardConfig(example_inputs=batch), the batch as pipeline_step takes it"
        )
    args, _ = spec.inputs(dict(example))
    size = args[0].shape[0]
    micro = config.num_microbatches or num_stages  # the schedule's default (pipeline.stage): one per stage
    if size % micro:
        raise ValueError(
            f"ShardConfig(example_inputs=...): batch size {size} is not divisible by num_microbatches={micro}"
        )
    x = tuple(a[: size // micro] for a in args)  # one microbatch, as the schedule cuts it
    shapes = {}
    with torch.no_grad():
        for s in range(num_stages):
            out = spec.stage_forward(x, first=s == 0, last=s == num_stages - 1)
            out = out if isinstance(out, tuple) else (out,)
            shapes[s] = {"input_args": _meta(x), "output_args": _meta(out)}
            x = out
    return shapes, tuple(tuple(a.shape) for a in args)


def check_simulated_shapes(info, shapes: tuple) -> None:
    """A simulated pipeline runs the shapes it was built for (its stages cannot learn others)."""
    if info.static and info.shapes is not None and info.shapes != shapes:
        raise ValueError(
            f"a simulated pipeline rank was built for inputs of shapes {info.shapes} (ShardConfig(example_inputs=...)) "
            f"and cannot learn new ones: got {shapes}"
        )


def _meta(tensors: tuple) -> tuple:
    """Shapes and dtypes; a float tensor carries a gradient back (run without one, it would say it does not)."""
    return tuple(torch.empty_like(t, device="meta").requires_grad_(t.is_floating_point()) for t in tensors)
