"""Everything a plugin needs, from one module: ``from shardcore.plugin_api import ...``.

The names here are the plugin-author API: they keep working for at least one minor version after
they move (the old path warns with a ``DeprecationWarning`` naming the new one, as ``shardcore.layers``
does for 0.1's paths). The conformance kit a plugin tests with is :mod:`shardcore.testing`.

* the contract: :class:`Policy` and its descriptions, :class:`CompositePolicy`, :func:`hookimpl`,
  the stage mixins (:class:`HFStages`, :class:`PipelineHooks`, :class:`SequenceHooks`, :class:`PipelineHole`);
* the parallel layers, their mappings and :class:`ShardSpec` (:mod:`shardcore.tensor_parallel`);
* the builders of the usual descriptions (:mod:`shardcore.builders`);
* the losses a pipeline's last stage and a vocabulary-split head use (:mod:`shardcore.losses`);
* the expert layers (:mod:`shardcore.expert_parallel.experts`) and the helpers the bundled plugins
  use: checkpoint parts, routing, group sizes.
"""

from __future__ import annotations

from . import tensor_parallel
from .builders import attention, experts, mlp, packed_attention, vocab_embedding, vocab_head
from .checkpoint.parts import StackedParts
from .composite import CompositePolicy
from .config import ShardConfig
from .data_parallel import native_class
from .distributed.collectives import group_rank, group_size
from .expert_parallel import route
from .expert_parallel.experts import ExpertsEP, ExpertsTP
from .hookspecs import hookimpl
from .integrations.hf.causal_lm_loss import defer_logits_gather, loss_on_head_slices
from .integrations.hf.stages import HFStages
from .losses import classification_items, classification_loss, token_items, token_loss
from .pipeline import PipelineHole
from .pipeline.hooks import PipelineHooks
from .policy import ModulePolicyDescription, Policy, SubModuleReplacementDescription
from .sequence.hooks import SequenceHooks
from .tensor_parallel import *  # noqa: F403 - the parallel layers and mappings, every name of their __all__

__all__ = [
    "CompositePolicy",
    "ExpertsEP",
    "ExpertsTP",
    "HFStages",
    "ModulePolicyDescription",
    "PipelineHole",
    "PipelineHooks",
    "Policy",
    "SequenceHooks",
    "ShardConfig",
    "StackedParts",
    "SubModuleReplacementDescription",
    "attention",
    "classification_items",
    "classification_loss",
    "defer_logits_gather",
    "experts",
    "group_rank",
    "group_size",
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
