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


class Policy:
    """Base class of a model family's sharding policy.

    The sharder sets ``model``, ``shard_config`` and ``tp_size`` before calling, in this order,
    :meth:`config_sanity_check`, :meth:`preprocess`, :meth:`module_policy`, :meth:`postprocess`.
    :meth:`blocks` says which repeated blocks the model is made of.
    """

    model: nn.Module
    shard_config: ShardConfig
    tp_size: int

    #: Whether the policy honours ``ShardConfig(parallel_output=True)`` (keeps logits split over the
    #: vocabulary and computes the loss from them). ``optimize`` refuses the flag otherwise, rather
    #: than returning full logits the user did not ask for.
    supports_parallel_output: bool = False

    #: ``True``: during each forward of the sharded model, column-parallel layers that read the
    #: same tensor share one backward all-reduce (:func:`shardcore.tensor_parallel.mappings.shared_copies`),
    #: without ``enter_tp_region`` entries. Plans use it; plugins name their regions instead.
    share_tp_copies: bool = False

    #: The ``ShardConfig.sequence_parallelism_mode`` values this policy supports (see
    #: :mod:`shardcore.sequence`); ``optimize`` refuses the others, naming them.
    sequence_parallelism_modes: tuple[str, ...] = ()

    #: Dropout modules (suffixes inside each block) that act on sequence-split activations under
    #: sequence parallelism (residual dropout): they then draw from the per-rank random stream.
    sequence_parallel_dropouts: tuple[str, ...] = ()

    #: Keyword arguments of every block that run along the sequence with the hidden states
    #: (rotary ``position_embeddings``): under ``all_to_all`` / ``ring_attn`` each rank takes its slice.
    sequence_split_kwargs: tuple[str, ...] = ()

    def sequence_parallel_regions(self) -> list[list[tuple[str, nn.Module]]]:
        """Runs of consecutive blocks that ``split_gather`` splits along the sequence, each at its
        first block's input and gathered at its last block's output: by default one, all of
        :meth:`blocks`. An encoder-decoder whose decoder reads the encoder's whole output
        (cross-attention) names its encoder's blocks only."""
        return [self.blocks()]

    def sequence_parallel_heads(self) -> tuple[int, int]:
        """``(attention heads, key/value heads)`` for ``all_to_all``, which gives each rank whole heads."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sequence_parallel_heads()")

    def sequence_attention_problem(self, mode: str = "all_to_all") -> str | None:
        """Why :meth:`set_sequence_attention` cannot run ``mode`` on this model (``None``: it can);
        asked before any collective."""
        from .kernels import ulysses_problem

        return ulysses_problem(self.model, mode)

    def set_sequence_attention(self, state) -> str:
        """Make the model's attention run under ``all_to_all`` (see
        :func:`shardcore.sequence.ulysses_attention`); returns the name now in use. The default
        registers it in HuggingFace's attention registry around the model's implementation."""
        from .kernels import use_ulysses_attention

        return use_ulysses_attention(self.model, state.mode)

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
        (``self.block_type()``); ``data_parallel="fsdp"`` wraps each block in FSDP, and it is the
        list pipeline stages and activation checkpointing are to be cut along (not built yet). Structural: read the model instance,
        import nothing from the model library.
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

    # -- pipeline parallelism (see shardcore.pipeline); a policy without them refuses it -------

    @property
    def pipeline_block_returns_tuple(self) -> bool:
        """Whether a block returns a tuple whose first element is the hidden states rather than
        the hidden states: what its pipeline hole returns. Default: ``True`` for a HuggingFace
        model under transformers 4.x (its layers return ``(hidden, ...)``), else ``False``."""
        if not type(self.model).__module__.startswith("transformers."):
            return False
        import transformers  # the model is a transformers model: it is imported already

        return int(transformers.__version__.split(".")[0]) < 5

    #: Why ``generate()`` cannot run through this model's pipeline stages (``None``: it can).
    pipeline_generate_unsupported: str | None = None

    def pipeline_ends(self) -> dict[str, str | int]:
        """``{path: "first" | "last" | block index}``: the modules outside :meth:`blocks` only one
        stage runs: the first (the embedding), the last (final norm, head), or the stage holding
        block ``i`` (an encoder-decoder's decoder embedding goes with its first decoder block).
        Other stages hold holes in their place. A path may name a parameter of a module that
        stays (timm's root ``cls_token``): the stages that do not hold it do not have it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_ends()")

    def pipeline_zero_ends(self) -> set[str]:
        """Paths of :meth:`pipeline_ends` whose output the model *adds* to the hidden states (a
        position embedding): their holes return zero instead of handing the input through."""
        return set()

    def pipeline_inputs(self, batch: dict, training: bool = True) -> tuple[tuple, Any]:
        """``(positional inputs of the first stage, labels or None)`` from a batch as the model
        takes it (keyword arguments); every tensor with the batch as its first dimension (they are
        cut into microbatches). ``training=False``: a forward through the pipeline (arguments
        ``generate()`` passes may come too)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_inputs()")

    def pipeline_stage_forward(self, inputs: tuple, *, first: bool, last: bool):
        """Run ``self.model`` (pruned to this rank's stages) on one stage's inputs: the first
        stage's are :meth:`pipeline_inputs`; the others get what the previous stage returned. The
        last stage returns what :meth:`pipeline_loss` takes (logits)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_stage_forward()")

    def pipeline_output(self, output, loss, *extra):
        """What ``model(...)`` returns from the last stage's ``output`` (and ``loss``, or ``None``)
        when a forward runs through the pipeline; ``extra``: the last stage's further outputs when
        it returns a tuple (``output`` is its first element)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_output()")

    def pipeline_num_items(self, labels) -> Any:
        """The number of loss terms of the whole batch (label tokens the loss counts)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_num_items()")

    def pipeline_loss(self, output, labels, num_items):
        """One microbatch's loss summed over its terms and divided by the whole batch's
        ``num_items``: the microbatches' losses then add up to the whole batch's mean loss."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_loss()")

    def data_parallel_shard_dims(self) -> dict[str, int]:
        """``{parameter name: dim}``: parameters ``ShardConfig(data_parallel="fsdp")`` splits over the
        data-parallel ranks along a dimension other than 0 (FSDP's default for the others). A
        plan's ``dp`` entries say it; policies rarely need to."""
        return {}

    def set_attention_backend(self, backend: str) -> str:
        """Make the model's attention run on ``backend`` (``"flash_attention_2"`` or ``"sdpa"``, see
        :func:`shardcore.kernels.attention_backend`) for ``ShardConfig(enable_flash_attention=True)``;
        returns the name of what now runs. The default plugs into HuggingFace's attention
        registry (``set_attn_implementation``); policies of other libraries override it."""
        from .kernels import use_hf_attention

        return use_hf_attention(self.model, backend)

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

    @staticmethod
    def require_divisible(value: int, tp_size: int, field: str, model: str) -> None:
        """Raise ``ValueError`` naming ``field`` if ``tp_size`` does not divide ``value``."""
        if value % tp_size:
            divisors = [d for d in range(1, value + 1) if value % d == 0]
            raise ValueError(
                f"{model}: {field}={value} is not divisible by tensor_parallel_size={tp_size}; "
                f"use a tensor_parallel_size among {divisors}."
            )
