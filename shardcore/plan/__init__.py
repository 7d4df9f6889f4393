"""Sharding plans: which parameter is split along which mesh axis, declared in YAML or a dict.

The syntax is torchprime's: each top-level key is a state-dict parameter name, ``*`` matching
any layer index, and its value a partition spec, one entry per dimension: a mesh axis name
(``tp``, ``dp``) or ``null`` (that dimension is replicated)::

    model.embed_tokens.weight: [tp, null]               # vocab parallel
    model.layers.*.self_attn.q_proj.weight: [tp, null]  # column parallel
    model.layers.*.self_attn.o_proj.weight: [null, tp]  # row parallel
    lm_head.weight: [tp, null]                          # vocab-parallel head
    model.layers.*.mlp.up_proj.weight: [tp, dp]         # column parallel, FSDP splits dim 1

``dp`` names the dimension FSDP splits a parameter along over the data-parallel ranks (with
``ShardConfig(data_parallel="fsdp")``, which splits every parameter, along dim 0 unless the plan
says otherwise); one dimension per axis.

A replicated parameter that acts on split activations (a norm over each head's features) takes
the spec ``replicated_with_grad_allreduce`` (transformers' name): its gradient is summed over
the group. A key naming a module instead (``model.layers.*.mlp``, ``name[i]`` for element ``i`` of a tuple
output) is an activation spec: the layout of that module's output, which shardcore's layers
decide; it is checked against them (a disagreement is an error), never ignored.

:class:`PlanPolicy` turns a plan into a :class:`~shardcore.Policy` made of shardcore's own
parallel layers: ``nn.Embedding`` ``[tp, null]`` -> vocab-parallel embedding; the model's output
embedding (or a Linear tied to an embedding) ``[tp, null]`` -> vocab-parallel LM head (full
logits); ``nn.Linear`` ``[tp, null]`` ->
column parallel, ``[null, tp]`` -> row parallel, split by attention heads when the parent module
has a ``head_dim`` (KV heads fewer than the group are replicated, as the plugins do). Column
layers reading one tensor share one backward all-reduce, so a plan costs the same collectives as
a plugin. Every key must match something, every split must divide, every axis must be known: all
checked in :meth:`PlanPolicy.config_sanity_check`, before any collective.

A key may also take one of transformers' tensor-parallel style names (``colwise_gather_output``,
``packed_colwise``, ``moe_tp_experts``, ...: :mod:`shardcore.plan.styles`), which is how the plans
a model ships are applied (zero-config: :mod:`shardcore.plan.zero_config`); ``plan="derive"`` derives
one from the model's modules (:mod:`shardcore.plan.derive`). Plans shardcore did not write are
checked against the unsharded model (``ShardConfig(verify=...)``, :mod:`shardcore.verify`).
"""

from __future__ import annotations

from . import styles as _styles  # noqa: F401 - shardcore's own plan styles registered before any plan is read
from .derive import DERIVE, derived_plan, derived_policy
from .policy import PlanPolicy
from .registry import Site, Style, find_style, register_style
from .syntax import PlanError, load_plan
from .zero_config import hf_tp_plan, zero_config_policy

__all__ = [
    "DERIVE",
    "PlanError",
    "PlanPolicy",
    "Site",
    "Style",
    "derived_plan",
    "derived_policy",
    "find_style",
    "hf_tp_plan",
    "load_plan",
    "register_style",
    "zero_config_policy",
]
