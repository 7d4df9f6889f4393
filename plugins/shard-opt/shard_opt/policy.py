"""Tensor parallel for OPT: q, k, v column parallel by heads and ``out_proj`` row parallel; ``fc1``
column and ``fc2`` row parallel; the token embedding and the LM head (tied) vocabulary parallel.

Crossing the wire per block: one all-reduce after ``out_proj``, one after ``fc2`` (forward), one
each where the attention and the MLP enter the region (backward). Replicated: the learned
positions, the layer norms, ``project_in``/``project_out`` where the config has them, and a
classification head's ``score``. Attention dropout draws per rank (each rank drops its own heads);
the residual dropouts of the decoder layer stay on the shared stream (replicas in step).

The policy is structural: it reads the model instance (``self.model``) and imports nothing from
transformers, so importing it is cheap and a user of another library never pays for this one.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    HFStages,
    SequenceSpec,
    StageFacts,
    attention,
    block_type,
    blocks_in,
    mlp,
    require_divisible,
    vocab_embedding,
    vocab_head,
)

__all__ = ["OPTPolicy"]


class OPTPolicy(HFStages, Policy):
    def stages(self):
        # pipeline parallelism on the model's own forward: the modules under the base model only the
        # first / the last stage runs; HFStages does the rest (see StageFacts)
        return StageFacts(
            first_ends=("decoder.embed_tokens", "decoder.embed_positions", "decoder.project_in"),  # project_*: optional
            last_ends=("decoder.final_layer_norm", "decoder.project_out"),
            zero_ends=("decoder.embed_positions",),  # added to the hidden states: zero on later stages
            # OPT derives its positions from the attention mask (left padding shifts them): no arange default
            inputs={"attention_mask": "ones"},
        )

    def sequence(self):
        heads = self.model.config.num_attention_heads
        return SequenceSpec(
            # Megatron's split, Ulysses and the ring (transformers' attention registry); the learned
            # positions are added before the first block, where the sequence is still whole
            modes=("split_gather", "all_to_all", "ring_attn"),
            dropouts=("",),  # the residual and activation dropouts, in the decoder layer: this rank's tokens
            heads=(heads, heads),
        )

    @property
    def base(self):
        return self.model.base_model  # OPTModel under any head

    def blocks(self):
        """The decoder layers, in order (pipeline stages, FSDP and the kit use this list)."""
        return blocks_in(self.model, self.base.decoder.layers)

    def config_sanity_check(self) -> None:
        """Every reason the model cannot be sharded at ``self.tp_size``, raised before any collective."""
        cfg, name = self.model.config, type(self.model).__name__
        require_divisible(cfg.num_attention_heads, self.tp_size, "num_attention_heads", name)
        require_divisible(cfg.ffn_dim, self.tp_size, "ffn_dim", name)

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        names = ("q_proj", "k_proj", "v_proj", "out_proj")
        policy = {
            block_type(self.blocks(), self.model): ModulePolicyDescription(
                attribute_replacement={"self_attn.num_heads": heads // tp},  # the attention's view() reads it
                sub_module_replacement=attention("self_attn", heads, head_dim, names=names) + mlp("", ("fc1",), "fc2"),
                enter_tp_region=["self_attn"],  # q, k, v read one tensor: one backward all-reduce for the three
                per_rank_rng=["self_attn"],  # attention dropout drops this rank's heads
            ),
            type(self.base.decoder): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("embed_tokens", self.shard_config)]
            ),
        }
        if hasattr(self.model, "lm_head"):
            policy[type(self.model)] = ModulePolicyDescription(
                sub_module_replacement=[vocab_head("lm_head", self.shard_config)]
            )
        return policy
