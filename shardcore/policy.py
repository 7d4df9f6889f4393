"""Policies: data that says which submodules of a model become which parallel modules.

A :class:`Policy` is given the model and the :class:`~shardcore.ShardConfig`, checks that the
model can be sharded (:meth:`Policy.config_sanity_check`, before any collective), may prepare it
(:meth:`Policy.preprocess`), returns per module class a :class:`ModulePolicyDescription`
(:meth:`Policy.module_policy`) and may finish it (:meth:`Policy.postprocess`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from torch import nn

from .config import ShardConfig
from .moved import legacy_spec, policy_member, warn_legacy
from .spec import (
    CheckpointSpec,
    ChecksSpec,
    DataParallelSpec,
    ExpertSpec,
    KernelSpec,
    PipelineSpec,
    SequenceSpec,
    TensorParallelSpec,
)

__all__ = [
    "ModulePolicyDescription",
    "Policy",
    "SubModuleReplacementDescription",
    "block_type",
    "blocks_in",
    "in_blocks",
    "require_divisible",
    "require_kv_heads",
]


@attrs.frozen(kw_only=True)
class SubModuleReplacementDescription:
    """Replace the submodule at ``suffix`` (dotted, relative to the matched module) with
    ``target_module.from_native_module(submodule, process_group, **kwargs)``.

    ``ignore_if_not_exist=True`` skips a missing submodule instead of raising.
    """

    suffix: str
    target_module: type
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    ignore_if_not_exist: bool = False


@attrs.frozen(kw_only=True)
class ModulePolicyDescription:
    """What happens to every module of one class.

    * ``attribute_replacement``: ``{"dotted.attr": value}`` set on the module (e.g. per-rank head counts);
    * ``param_replacement``: callables ``f(module)`` run on the module;
    * ``sub_module_replacement``: :class:`SubModuleReplacementDescription` list;
    * ``method_replacement``: ``{"name": function}`` bound to the module instance (modeling overrides);
    * ``enter_tp_region``: suffixes of submodules whose input (``hidden_states`` or the first
      positional argument) enters the tensor-parallel region once, so the column-parallel layers
      inside them (built with ``copy_input=False``) share one backward all-reduce instead of one
      each (``q``/``k``/``v`` or ``gate``/``up`` projections reading the same tensor);
    * ``per_rank_rng``: suffixes of submodules that work on split activations (attention over
      this rank's heads) and whose forward draws random numbers (dropout): they run on a per-rank
      random stream, so ranks drop independently while replicated dropout stays in step;
    * ``shared_rng``: suffixes of submodules *inside* a ``per_rank_rng`` submodule that work on
      replicated activations (a residual dropout after the attention's row-parallel output):
      they go back to the shared stream, so the replicas stay equal.
    """

    attribute_replacement: dict[str, Any] = attrs.field(factory=dict)
    param_replacement: list[Callable[[nn.Module], None]] = attrs.field(factory=list)
    sub_module_replacement: list[SubModuleReplacementDescription] = attrs.field(factory=list)
    method_replacement: dict[str, Callable] = attrs.field(factory=dict)
    enter_tp_region: list[str] = attrs.field(factory=list)
    per_rank_rng: list[str] = attrs.field(factory=list)
    shared_rng: list[str] = attrs.field(factory=list)


class Policy:
    """Base class of a model family's sharding policy.

    Tensor parallelism is the contract: the sharder sets ``model``, ``shard_config`` and ``tp_size``, then
    calls :meth:`config_sanity_check`, :meth:`preprocess`, :meth:`module_policy` and :meth:`postprocess`;
    :meth:`blocks` says which repeated blocks the model is made of. Everything else a family supports is
    one declared spec each (:mod:`shardcore.spec`), returned by :meth:`tensor_parallel`, :meth:`pipeline`,
    :meth:`sequence`, :meth:`experts`, :meth:`data_parallel`, :meth:`kernels`, :meth:`checkpoints` and
    :meth:`checks`; the defaults declare nothing (the feature is refused, by name). A new parallelism adds
    a spec and a method here, not an edit in every plugin.
    """

    model: nn.Module
    shard_config: ShardConfig
    tp_size: int
    #: every parallel degree of the run (:class:`~shardcore.ParallelLayout`), set by ``optimize``
    layout: Any = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        warn_legacy(cls)  # 0.x's members, still read (shardcore.moved)

    def __getattr__(self, name: str):
        """0.x's members and helpers, read through their new spelling with a ``DeprecationWarning`` (shardcore.moved)."""
        return policy_member(self, name)

    def set_model(self, model: nn.Module) -> None:
        self.model = model

    def set_shard_config(self, shard_config: ShardConfig, tp_size: int) -> None:
        self.shard_config = shard_config
        self.tp_size = tp_size

    # -- tensor parallelism: the contract --------------------------------------------------------------

    def config_sanity_check(self) -> None:
        """Raise a clear error if the model cannot be sharded at ``self.tp_size``
        (:func:`require_divisible`, :func:`require_kv_heads`).

        Runs on every rank before any collective, so an error here never leaves a rank hanging.
        """

    def preprocess(self) -> nn.Module:
        """Prepare the model before modules are replaced; returns the model."""
        return self.model

    def blocks(self) -> list[tuple[str, nn.Module]]:
        """The model's repeated blocks, in order, as ``(qualified name, module)`` pairs (:func:`blocks_in`).

        Decoder layers for a decoder; encoder then decoder layers for an encoder-decoder. The
        conformance kit checks it (:func:`shardcore.testing.check_blocks`; every block must hold a
        parallel module once sharded) and a policy takes its layer classes from it (:func:`block_type`);
        ``data_parallel="fsdp"`` wraps each block in FSDP, pipeline stages are cut along it, and sequence
        parallelism (by default) splits at its first block and gathers after its last.
        Structural: read the model instance, import nothing from the model library.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement blocks()")

    def module_policy(self) -> dict[type | str, ModulePolicyDescription]:
        """Per module class (or its qualified name), what to do with every instance."""
        raise NotImplementedError(f"{type(self).__name__} must implement module_policy()")

    def postprocess(self) -> nn.Module:
        """Finish the model after modules are replaced; returns the model."""
        return self.model

    # -- one declared spec per parallelism (shardcore.spec); the defaults declare nothing -----------------

    def tensor_parallel(self) -> TensorParallelSpec:
        """Parallel output, shared copies, replicated parameters whose gradient is summed."""
        return legacy_spec(self, "tensor_parallel") or TensorParallelSpec()

    def pipeline(self) -> PipelineSpec | None:
        """How the model runs as pipeline stages; ``None``: pipeline parallelism refused."""
        return legacy_spec(self, "pipeline")

    def sequence(self) -> SequenceSpec:
        """The sequence-parallel modes the model supports and what they need."""
        return legacy_spec(self, "sequence") or SequenceSpec()

    def experts(self) -> ExpertSpec:
        """Whether the model's experts split over ``expert_parallel_size`` ranks."""
        return legacy_spec(self, "experts") or ExpertSpec()

    def data_parallel(self) -> DataParallelSpec:
        """Parameters FSDP splits along a dimension other than 0."""
        return legacy_spec(self, "data_parallel") or DataParallelSpec()

    def kernels(self) -> KernelSpec:
        """What the fused-norm, JIT-fused and flash-attention switches act on."""
        return legacy_spec(self, "kernels") or KernelSpec()

    def checkpoints(self) -> CheckpointSpec:
        """Checkpoint names and pieces that differ from the model's, and buffers to compute."""
        return legacy_spec(self, "checkpoints") or CheckpointSpec()

    def checks(self) -> ChecksSpec:
        """What ``ShardConfig(verify=...)`` compares: by default the policy's ``blocks()``."""
        return legacy_spec(self, "checks") or ChecksSpec(blocks=self.blocks())


# -- what a policy's code uses (shardcore.plugin_api) ------------------------------------------------------


def blocks_in(model: nn.Module, *containers: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every child of each container (a ``ModuleList`` of decoder
    layers), named from ``model``: the usual body of :meth:`Policy.blocks`."""
    paths = {id(m): name for name, m in model.named_modules()}
    out = []
    for container in containers:
        if id(container) not in paths:
            raise ValueError(f"blocks_in: {type(container).__name__} is not part of {type(model).__name__}")
        prefix = f"{paths[id(container)]}." if paths[id(container)] else ""
        out += [(prefix + name, child) for name, child in container.named_children()]
    return out


def in_blocks(blocks: list[tuple[str, nn.Module]], *suffixes: str) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of the submodule at each of ``suffixes`` in every block that has it
    (``in_blocks(self.blocks(), "mlp")`` for :attr:`KernelSpec.fusible <shardcore.spec.KernelSpec>`)."""
    out = []
    for name, block in blocks:
        for suffix in suffixes:
            try:
                out.append((f"{name}.{suffix}", block.get_submodule(suffix)))
            except AttributeError:
                continue
    return out


def block_type(blocks: list[tuple[str, nn.Module]], model: nn.Module | None = None) -> type:
    """The one class of ``blocks``; a clear error (naming ``model``) if they mix several."""
    types = list(dict.fromkeys(type(m) for _, m in blocks))
    if len(types) != 1:
        raise ValueError(
            f"expected every block of {type(model).__name__ if model is not None else 'the model'} to be of one "
            f"class, found {[t.__name__ for t in types]}; this policy does not cover mixed blocks"
        )
    return types[0]


def require_divisible(value: int, tp_size: int, field: str, model: str) -> None:
    """Raise ``ValueError`` naming ``field`` if ``tp_size`` does not divide ``value``."""
    if value % tp_size:
        divisors = [d for d in range(1, value + 1) if value % d == 0]
        raise ValueError(
            f"{model}: {field}={value} is not divisible by tensor_parallel_size={tp_size}; "
            f"use a tensor_parallel_size among {divisors}."
        )


def require_kv_heads(kv_heads: int, heads: int, tp_size: int, model: str) -> None:
    """Raise ``ValueError`` unless ``kv_heads`` key/value heads can be split over ``tp_size`` ranks
    (it divides them) or replicated on them (a multiple of them: each head on ``tp_size // kv_heads``
    ranks, as :meth:`ShardSpec.heads <shardcore.tensor_parallel.ShardSpec.heads>` lays them out)."""
    if kv_heads % tp_size and tp_size % kv_heads:
        raise ValueError(
            f"{model}: num_key_value_heads={kv_heads} can neither be split over nor replicated on "
            f"tensor_parallel_size={tp_size}; use a tensor_parallel_size that divides {kv_heads} or is a "
            f"multiple of it (and divides num_attention_heads={heads})."
        )
