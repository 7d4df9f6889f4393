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
from .data_parallel.hooks import DataParallelHooks
from .expert_parallel.hooks import ExpertParallelHooks
from .pipeline.hooks import PipelineHooks
from .sequence.hooks import SequenceHooks

__all__ = ["ModulePolicyDescription", "Policy", "SubModuleReplacementDescription"]


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


class Policy(SequenceHooks, PipelineHooks, DataParallelHooks, ExpertParallelHooks):
    """Base class of a model family's sharding policy.

    The sharder sets ``model``, ``shard_config`` and ``tp_size`` before calling, in this order,
    :meth:`config_sanity_check`, :meth:`preprocess`, :meth:`module_policy`, :meth:`postprocess`.
    :meth:`blocks` says which repeated blocks the model is made of. What it says about sequence,
    pipeline and data parallelism lives beside each (:class:`~shardcore.sequence.hooks.SequenceHooks`,
    :class:`~shardcore.pipeline.hooks.PipelineHooks`, :class:`~shardcore.data_parallel.hooks.DataParallelHooks`,
    :class:`~shardcore.expert_parallel.hooks.ExpertParallelHooks`):
    a new parallelism adds its own hooks class here, not an edit in every plugin.
    """

    model: nn.Module
    shard_config: ShardConfig
    tp_size: int
    #: every parallel degree of the run (:class:`~shardcore.ParallelLayout`), set by ``optimize``
    layout: Any = None

    #: Whether the policy honours ``ShardConfig(parallel_output=True)`` (keeps logits split over the
    #: vocabulary and computes the loss from them). ``optimize`` refuses the flag otherwise, rather
    #: than returning full logits the user did not ask for.
    supports_parallel_output: bool = False

    #: ``True``: during each forward of the sharded model, column-parallel layers that read the
    #: same tensor share one backward all-reduce (:func:`shardcore.tensor_parallel.mappings.shared_copies`),
    #: without ``enter_tp_region`` entries. Plans use it; plugins name their regions instead.
    share_tp_copies: bool = False

    def not_overridden(self, *hooks: str) -> list[str]:
        """Those of ``hooks`` this policy's class leaves as :class:`Policy` defines them."""
        return [h for h in hooks if getattr(type(self), h) is getattr(Policy, h)]

    def set_model(self, model: nn.Module) -> None:
        self.model = model

    def set_shard_config(self, shard_config: ShardConfig, tp_size: int) -> None:
        self.shard_config = shard_config
        self.tp_size = tp_size

    def config_sanity_check(self) -> None:
        """Raise a clear error if the model cannot be sharded at ``self.tp_size``.

        Runs on every rank before any collective, so an error here never leaves a rank hanging.
        """

    def preprocess(self) -> nn.Module:
        """Prepare the model before modules are replaced; returns the model."""
        return self.model

    def blocks(self) -> list[tuple[str, nn.Module]]:
        """The model's repeated blocks, in order, as ``(qualified name, module)`` pairs.

        Decoder layers for a decoder; encoder then decoder layers for an encoder-decoder. The
        conformance kit checks it (:func:`shardcore.testing.check_blocks`; every block must hold a
        parallel module once sharded) and a policy takes its layer classes from it
        (``self.block_type()``); ``data_parallel="fsdp"`` wraps each block in FSDP, pipeline stages
        are cut along it, and sequence parallelism (by default) splits at its first block and gathers after its
        last. (Activation checkpointing is the model's own, HuggingFace's per-block checkpoint.)
        Structural: read the model instance, import nothing from the model library.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement blocks()")

    def block_types(self) -> list[type]:
        """The distinct classes of :meth:`blocks`, in first-seen order."""
        return list(dict.fromkeys(type(m) for _, m in self.blocks()))

    def block_type(self) -> type:
        """The one class of :meth:`blocks`; a clear error if the model mixes several."""
        types = self.block_types()
        if len(types) != 1:
            raise ValueError(
                f"{type(self).__name__}: expected every block of {type(self.model).__name__} to be of one class, "
                f"found {[t.__name__ for t in types]}; this policy does not cover mixed blocks"
            )
        return types[0]

    def blocks_in(self, *containers: nn.Module) -> list[tuple[str, nn.Module]]:
        """``(qualified name, module)`` of every child of each container (e.g. a ``ModuleList`` of
        decoder layers), named from ``self.model``: the usual body of :meth:`blocks`."""
        paths = {id(m): name for name, m in self.model.named_modules()}
        out = []
        for container in containers:
            if id(container) not in paths:
                raise ValueError(f"{type(self).__name__}.blocks(): {type(container).__name__} is not part of the model")
            prefix = f"{paths[id(container)]}." if paths[id(container)] else ""
            out += [(prefix + name, child) for name, child in container.named_children()]
        return out

    def sequence_attention_problem(self, mode: str = "all_to_all") -> str | None:
        """Why :meth:`set_sequence_attention` cannot run ``mode`` on this model (``None``: it can);
        asked before any collective. The default asks HuggingFace's attention registry."""
        from .kernels import attention_registry

        return attention_registry().sequence_problem(self.model, mode)

    def set_sequence_attention(self, state) -> str:
        """Make the model's attention run under ``state.mode`` (see :mod:`shardcore.sequence`); the name
        now in use. The default registers it in HuggingFace's attention registry around the model's own."""
        from .kernels import attention_registry

        return attention_registry().use_sequence(self.model, state.mode)

    def set_attention_backend(self, backend: str) -> str:
        """Make the model's attention run on ``backend`` (``"flash_attention_2"`` or ``"sdpa"``, see
        :func:`shardcore.kernels.attention_backend`) for ``ShardConfig(enable_flash_attention=True)``;
        returns the name of what now runs. The default plugs into HuggingFace's attention
        registry (``set_attn_implementation``); policies of other libraries override it."""
        from .kernels import attention_registry

        return attention_registry().use(self.model, backend)

    def norm_classes(self) -> tuple[type, ...]:
        """The model library's normalization classes ``enable_fused_normalization`` puts on fused
        kernels: subclasses of ``nn.LayerNorm`` that compute a plain layer norm (onto
        :class:`~shardcore.tensor_parallel.FusedLayerNorm`) and RMSNorms computing ``weight * x / rms(x)`` in
        fp32 (onto :class:`~shardcore.tensor_parallel.FusedRMSNorm`). ``nn.LayerNorm`` and ``nn.RMSNorm``
        themselves are always covered. Structural: take them from the model instance. Default: none."""
        return ()

    def fusible_modules(self) -> list[tuple[str, nn.Module]]:
        """``(name, module)`` of the submodules ``enable_jit_fused`` compiles: modules whose forward
        is projections and elementwise work (bias + GeLU, SwiGLU, bias + dropout + residual), whose
        compiled forward fuses the elementwise ops. Not attention (caches, masks). Default: none."""
        return []

    def in_blocks(self, *suffixes: str) -> list[tuple[str, nn.Module]]:
        """``(qualified name, module)`` of the submodule at each of ``suffixes`` in every block of
        :meth:`blocks` that has it (e.g. ``in_blocks("mlp")`` for :meth:`fusible_modules`)."""
        out = []
        for name, block in self.blocks():
            for suffix in suffixes:
                try:
                    out.append((f"{name}.{suffix}", block.get_submodule(suffix)))
                except AttributeError:
                    continue
        return out

    def module_policy(self) -> dict[type | str, ModulePolicyDescription]:
        """Per module class (or its qualified name), what to do with every instance."""
        raise NotImplementedError(f"{type(self).__name__} must implement module_policy()")

    def postprocess(self) -> nn.Module:
        """Finish the model after modules are replaced; returns the model."""
        return self.model

    def materialize_buffers(self, modules: list[nn.Module]) -> None:
        """Fill buffers that a checkpoint does not hold (non-persistent ones, e.g. rotary
        frequencies) after :func:`shardcore.load_checkpoint` materialized a meta-built model;
        the buffers of ``modules`` are allocated but uninitialized.

        The default follows the HuggingFace convention: ``model._init_weights(module)`` computes
        a module's buffers. Policies of other libraries override this.
        """
        init = getattr(self.model, "_init_weights", None)
        if init is None:
            names = [type(m).__name__ for m in modules]
            raise NotImplementedError(
                f"{type(self).__name__} cannot compute the buffers of {names} after lazy initialization; "
                "override Policy.materialize_buffers or build the model on a real device"
            )
        for module in modules:
            init(module)

    def checkpoint_names(self, names: list[str]) -> dict[str, str]:
        """``{model tensor name: name in the library's checkpoint format}`` for names that differ.

        :func:`shardcore.load_checkpoint` accepts either name; :func:`shardcore.save_checkpoint`
        writes the checkpoint name, so the library's own loader reads the files. Default: none differ.
        """
        return {}

    def checkpoint_parts(self, names: list[str]) -> dict:
        """``{model tensor name: StackedParts}`` for tensors the library's checkpoint format keeps
        in pieces (:class:`shardcore.checkpoint.parts.StackedParts`: transformers 5 writes fused
        expert weights one tensor per expert); :func:`shardcore.load_checkpoint` reads them from
        their pieces, each rank only its slice's. Default: none."""
        return {}

    @staticmethod
    def require_divisible(value: int, tp_size: int, field: str, model: str) -> None:
        """Raise ``ValueError`` naming ``field`` if ``tp_size`` does not divide ``value``."""
        if value % tp_size:
            divisors = [d for d in range(1, value + 1) if value % d == 0]
            raise ValueError(
                f"{model}: {field}={value} is not divisible by tensor_parallel_size={tp_size}; "
                f"use a tensor_parallel_size among {divisors}."
            )

    @staticmethod
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
