"""Tensor parallel for MyModel: say here what is split, what crosses the wire, what stays replicated.

The policy is structural: it reads the model instance (``self.model``) and imports nothing from
the model library, so importing it is cheap and a user of another library never pays for this one.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    HFStages,
    StageFacts,
    attention,
    block_type,
    blocks_in,
    mlp,
    require_divisible,
    vocab_embedding,
    vocab_head,
)

__all__ = ["MyModelPolicy"]


class MyModelPolicy(HFStages, Policy):
    def stages(self):
        # pipeline parallelism on the model's own forward (a HuggingFace causal LM): the modules under the
        # base model only the first / the last stage runs; HFStages does the rest (see StageFacts)
        return StageFacts(first_ends=("embed",), last_ends=("norm",))

    @property
    def base(self):
        return self.model.base_model  # the bare model under any head

    def blocks(self):
        """The repeated layers, in order (pipeline stages, FSDP and the kit use this list)."""
        return blocks_in(self.model, self.base.layers)

    def config_sanity_check(self) -> None:
        """Every reason the model cannot be sharded at ``self.tp_size``, raised before any collective."""
        cfg, name = self.model.config, type(self.model).__name__
        require_divisible(cfg.num_attention_heads, self.tp_size, "num_attention_heads", name)
        require_divisible(cfg.intermediate_size, self.tp_size, "intermediate_size", name)

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        heads, head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
        layer_cls = block_type(self.blocks(), self.model)
        policy = {
            layer_cls: ModulePolicyDescription(
                attribute_replacement={"attn.num_heads": heads // tp},  # what the forward reads per rank
                sub_module_replacement=attention("attn", heads, head_dim) + mlp("mlp", ("up",), "down"),
                enter_tp_region=["attn"],  # q, k, v read one tensor: one backward all-reduce for the three
                per_rank_rng=["attn"],  # attention dropout drops this rank's heads
            ),
            type(self.base): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("embed", self.shard_config)]
            ),
        }
        if hasattr(self.model, "lm_head"):
            policy[type(self.model)] = ModulePolicyDescription(
                sub_module_replacement=[vocab_head("lm_head", self.shard_config)]
            )
        return policy
