"""Everything a plugin needs, from one module: ``from shardcore.plugin_api import ...``.

The names here are the plugin-author API: they keep working for at least one minor version after
they move (the old path warns with a ``DeprecationWarning`` naming the new one, as ``shardcore.layers``
does for 0.1's paths). The conformance kit a plugin tests with is :mod:`shardcore.testing`.

* the contract: :class:`Policy` and its descriptions, :class:`CompositePolicy`, :func:`hookimpl`;
* the specs a policy declares, one per parallelism (:mod:`shardcore.spec`: :class:`PipelineSpec`,
  :class:`SequenceSpec`, ...), :class:`HFStages` (a HuggingFace model's pipeline spec, from the :class:`StageFacts` its ``stages()`` returns) and :class:`PipelineHole`;
* the helpers a policy's code uses: :func:`blocks_in`, :func:`in_blocks`, :func:`block_type`,
  :func:`require_divisible`, :func:`require_kv_heads`, and :func:`attached` (a hook or a routed method a
  policy puts on the model goes through the model's registry, :mod:`shardcore.attach`);
* a plan style of the plugin's own (a layer kind a plan may name): :class:`Style`, :func:`register_style`
  (:mod:`shardcore.plan.registry`);
* the parallel layers, their mappings and :class:`ShardSpec` (:mod:`shardcore.tensor_parallel`);
* the builders of the usual descriptions (:mod:`shardcore.builders`);
* the losses a pipeline's last stage and a vocabulary-split head use (:mod:`shardcore.losses`);
* the expert layers (:mod:`shardcore.expert_parallel.experts`) and the helpers the bundled plugins
  use: checkpoint parts, routing, group sizes.
"""

from __future__ import annotations

from . import tensor_parallel
from .attach import attached
from .builders import attention, experts, heads_of_this_rank, mlp, packed_attention, vocab_embedding, vocab_head
from .checkpoint.parts import StackedParts
from .composite import CompositePolicy
from .config import ShardConfig
from .data_parallel import native_class
from .distributed.collectives import group_rank, group_size
from .expert_parallel import route
from .expert_parallel.experts import ExpertsEP, ExpertsTP
from .hookspecs import hookimpl
from .integrations.hf.causal_lm_loss import defer_logits_gather, loss_on_head_slices
from .integrations.hf.heads import attention_dims
from .integrations.hf.stages import (
    SEQ2SEQ_GENERATE_REFUSAL,
    HFStages,
    StageFacts,
    seq2seq_stage_batch,
    seq2seq_stage_output,
)
from .losses import classification_items, classification_loss, token_items, token_loss
from .pipeline import PipelineHole
from .plan.registry import NOT_HERE, Site, Style, register_style
from .policy import (
    ModulePolicyDescription,
    Policy,
    SubModuleReplacementDescription,
    block_type,
    blocks_in,
    in_blocks,
    require_divisible,
    require_kv_heads,
)
from .spec import (
    CheckpointSpec,
    ChecksSpec,
    DataParallelSpec,
    ExpertSpec,
    IdleRun,
    KernelSpec,
    PipelineSpec,
    SequenceSpec,
    TensorParallelSpec,
)
from .tensor_parallel import *  # noqa: F403 - the parallel layers and mappings, every name of their __all__

__all__ = [
    "NOT_HERE",
    "Site",
    "Style",
    "register_style",
    "CheckpointSpec",
    "ChecksSpec",
    "DataParallelSpec",
    "IdleRun",
    "ExpertSpec",
    "KernelSpec",
    "PipelineSpec",
    "SequenceSpec",
    "TensorParallelSpec",
    "block_type",
    "blocks_in",
    "in_blocks",
    "require_divisible",
    "require_kv_heads",
    "CompositePolicy",
    "ExpertsEP",
    "ExpertsTP",
    "HFStages",
    "StageFacts",
    "SEQ2SEQ_GENERATE_REFUSAL",
    "seq2seq_stage_batch",
    "seq2seq_stage_output",
    "ModulePolicyDescription",
    "PipelineHole",
    "Policy",
    "ShardConfig",
    "StackedParts",
    "SubModuleReplacementDescription",
    "attached",
    "attention",
    "attention_dims",
    "classification_items",
    "classification_loss",
    "defer_logits_gather",
    "experts",
    "group_rank",
    "group_size",
    "heads_of_this_rank",
    "hookimpl",
    "loss_on_head_slices",
    "mlp",
    "native_class",
    "packed_attention",
    "route",
    "token_items",
    "token_loss",
    "vocab_embedding",
    "vocab_head",
    *tensor_parallel.__all__,
]


def __getattr__(name: str):
    """0.x's hook base classes: a policy now returns a spec (:class:`PipelineSpec`, :class:`SequenceSpec`)."""
    if name in ("PipelineHooks", "SequenceHooks"):
        from .moved import hook_class

        return hook_class(name)
    raise AttributeError(f"module 'shardcore.plugin_api' has no attribute {name!r}")
