"""A pipeline configuration checked against the model and the layout before any collective."""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import nn

from .schedule import _DEFAULT_SCHEDULE, _SINGLE, _is_single, schedule_names, split_layers

#: the schedules that split the backward into input and weight gradients (zero bubble)
_SPLIT_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


@attrs.define
class PipelineInfo:
    """The pipeline of a model on this rank: ``model.shardcore.pipeline``."""

    schedule_name: str
    num_stages: int
    stage_indices: list[int]  # the stages this rank runs
    layers: list[int]  # blocks per stage
    group: Any
    num_microbatches: int
    stages: list = attrs.field(factory=list)  # torch PipelineStage objects
    submods: dict = attrs.field(factory=dict)  # {stage index: the module its PipelineStage runs}, built once
    schedule: Any = None
    tied: list = attrs.field(factory=list)  # (parameter name, group) whose gradients are summed over first/last stages
    last_stage_rank: int = 0  # in the pp group
    num_items: Any = None  # the loss terms of the batch in flight (pipeline_step sets it)
    spec: Any = None  # the policy's PipelineSpec (shardcore.spec), read once when the stages are built
    shapes: Any = None  # the input shapes the stages were built for
    static: dict = attrs.field(factory=dict)  # a simulated rank's stages' shapes, given to torch up front
    rebuild: Any = None
    loss_scale: Any = None  # pipeline_step(loss_scale=...) of the step in flight, and its unscaled losses
    unscaled: list = attrs.field(factory=list)
    input_gates: dict = attrs.field(factory=dict)  # per group dimension: which steps check the batch
    #: ``{name: [other names]}`` of parameters the unsharded model holds under several names (tied
    #: embeddings): a stage may hold one under a name a checkpoint stores under another.
    aliases: dict = attrs.field(factory=dict)
    #: ``callable(model)`` run after each ``pipeline_step``'s schedule (a zero-bubble schedule sets a
    #: later stage's weight gradients itself, with no autograd hook: ``grad_mark`` marks them here)
    after_step: list = attrs.field(factory=list)

    @property
    def is_first(self) -> bool:
        return 0 in self.stage_indices

    @property
    def is_last(self) -> bool:
        return self.num_stages - 1 in self.stage_indices


def check_pipeline(model: nn.Module, policy, config, layout) -> tuple[str, list[int], int]:
    """Check the pipeline ``config`` asks for, before any collective (the same on every rank).

    Returns ``(schedule name, blocks per stage, stages per rank)``.
    """
    name, per_rank = _check_schedule(config)
    try:  # found now, not at the first step, where one rank's error would leave the others waiting
        if policy.pipeline() is None:
            raise NotImplementedError(f"{type(policy).__name__}.pipeline() declares no PipelineSpec")
    except NotImplementedError as err:
        raise NotImplementedError(
            f"{type(model).__name__}: {type(policy).__name__} does not support pipeline parallelism ({err}); "
            "leave pipeline_parallel_size=1"
        ) from None
    if config.parallel_output:
        raise NotImplementedError(
            "ShardConfig(parallel_output=True) with pipeline parallelism: the last stage computes the loss on "
            "full logits; leave parallel_output=False"
        )
    if config.tensor_parallel_process_group is not None:
        raise ValueError(
            "pipeline parallelism runs on shardcore's device mesh, but a tensor_parallel_process_group was given; "
            "leave it out and let the parallel sizes cut the world"
        )
    if config.data_parallel is not None and name in _SPLIT_BACKWARD:
        raise NotImplementedError(
            f"ShardConfig(pipeline_schedule={name!r}, data_parallel={config.data_parallel!r}): a zero-bubble schedule "
            "computes weight gradients apart from the backward, outside what FSDP's reduction follows (measured: "
            "wrong gradients), so it is not built with data parallelism; use 1F1B, GPipe, Interleaved1F1B or LoopedBFS"
        )
    return name, _stage_layers(model, policy, config, layout.pp, per_rank), per_rank


def _check_schedule(config) -> tuple[str, int]:
    """The schedule's name and the stages it runs per rank."""
    name = config.pipeline_schedule or _DEFAULT_SCHEDULE
    valid = schedule_names()
    if name not in valid:
        raise ValueError(
            f"ShardConfig.pipeline_schedule={name!r} is not a schedule of this torch "
            f"({torch.__version__}); choose one of {', '.join(valid)}"
        )
    single = _is_single(name)
    per_rank = 1 if single else (config.pipeline_stages_per_rank or 2)
    if single and config.pipeline_stages_per_rank not in (None, 1):
        raise ValueError(
            f"ShardConfig(pipeline_schedule={name!r}) runs one stage per rank, but pipeline_stages_per_rank="
            f"{config.pipeline_stages_per_rank}; use a multi-stage schedule "
            f"({', '.join(n for n in valid if n not in _SINGLE)}) or leave pipeline_stages_per_rank unset"
        )
    if not single and per_rank < 2:
        raise ValueError(
            f"ShardConfig(pipeline_schedule={name!r}) is a multi-stage schedule: it needs at least 2 stages per "
            f"rank, got pipeline_stages_per_rank={per_rank}; use GPipe or 1F1B for one stage per rank"
        )
    if name in ("ZBVZeroBubble", "DualPipeV") and per_rank != 2:
        raise ValueError(f"ShardConfig(pipeline_schedule={name!r}) runs exactly 2 stages per rank (a V shape)")
    return name, per_rank


def pipeline_blocks(policy) -> list:
    """The ``(name, block)`` the stages are cut from: :attr:`PipelineSpec.blocks <shardcore.spec.PipelineSpec>`
    when the spec names them (a composite's language model), else ``Policy.blocks()``."""
    try:
        spec = policy.pipeline()
    except NotImplementedError:  # no stages for this model: its blocks are the policy's
        spec = None
    named = spec.blocks if spec is not None else None
    return list(named()) if named is not None else policy.blocks()


def _stage_layers(model: nn.Module, policy, config, pp: int, per_rank: int) -> list[int]:
    """The number of blocks of each stage: ``config.pipeline_layers`` checked, or an even split."""
    blocks = len(pipeline_blocks(policy))
    stages = pp * per_rank
    if stages > blocks:
        raise ValueError(
            f"{type(model).__name__} has {blocks} blocks, fewer than the {stages} pipeline stages "
            f"(pipeline_parallel_size={pp}" + (f" x {per_rank} stages per rank" if per_rank > 1 else "") + "); "
            "lower the pipeline degree"
        )
    if config.pipeline_layers is None:
        return split_layers(blocks, stages)
    layers = list(config.pipeline_layers)
    if len(layers) != stages or sum(layers) != blocks or min(layers) < 1:
        raise ValueError(
            f"ShardConfig.pipeline_layers={layers}: give {stages} numbers of blocks, each at least 1, "
            f"summing to the model's {blocks} blocks (got {len(layers)} numbers summing to {sum(layers)})"
        )
    return layers


def _stage_indices(pp_rank: int, pp: int, per_rank: int, name: str) -> list[int]:
    if per_rank == 1:
        return [pp_rank]
    if name in ("ZBVZeroBubble", "DualPipeV"):  # V shape: rank r holds stages r and 2P-1-r
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(per_rank)]  # looped: rank r holds r, r+P, ...
