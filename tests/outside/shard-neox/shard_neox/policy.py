"""Tensor, pipeline and sequence parallel for GPT-NeoX: ``query_key_value`` column parallel by whole heads
(:func:`shard_neox.styles.qkv_layer`), ``dense`` row parallel; ``dense_h_to_4h`` column, ``dense_4h_to_h``
row; the embedding and the LM head vocabulary parallel. Crossing the wire per block: one all-reduce after
``dense`` and one after ``dense_4h_to_h`` (forward), one each where the attention and the MLP enter the
region (backward). Replicated: the layer norms and the rotary tables.

The policy is structural: it reads the model instance (``self.model``) and imports nothing from
transformers, so importing it is cheap.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    HFStages,
    Linear1D_Row,
    SequenceSpec,
    StageFacts,
    SubModuleReplacementDescription,
    attached,
    block_type,
    blocks_in,
    mlp,
    require_divisible,
    vocab_embedding,
    vocab_head,
)

from .styles import qkv_layer

__all__ = ["NeoXPolicy"]


class NeoXPolicy(HFStages, Policy):
    def stages(self):
        # pipeline parallelism on the model's own forward: what only the first / the last stage runs
        return StageFacts(first_ends=("embed_in", "emb_dropout"), last_ends=("final_layer_norm",))

    @property
    def base(self):
        return self.model.base_model  # GPTNeoXModel under any head

    def blocks(self):
        return blocks_in(self.model, self.base.layers)

    def sequence(self):
        heads = self.model.config.num_attention_heads
        return SequenceSpec(
            modes=("split_gather", "all_to_all", "ring_attn"),
            dropouts=("post_attention_dropout", "post_mlp_dropout"),  # on this rank's tokens
            split_kwargs=("position_embeddings",),  # the rotary cos / sin each block is given
            heads=(heads, heads),
        )

    def config_sanity_check(self) -> None:
        cfg, name = self.model.config, type(self.model).__name__
        require_divisible(cfg.num_attention_heads, self.tp_size, "num_attention_heads", name)
        require_divisible(cfg.intermediate_size, self.tp_size, "intermediate_size", name)

    def module_policy(self):
        attention = self.blocks()[0][1].attention
        # the attention enters the region itself (enter_tp_region): under split_gather its input is the whole
        # sequence, which its forward's view reads
        qkv, kwargs = qkv_layer(attention.query_key_value, attention.head_size, copy_input=False)
        subs = [
            SubModuleReplacementDescription(suffix="attention.query_key_value", target_module=qkv, kwargs=kwargs),
            SubModuleReplacementDescription(suffix="attention.dense", target_module=Linear1D_Row),
            *mlp("mlp", ("dense_h_to_4h",), "dense_4h_to_h"),
        ]
        policy = {
            block_type(self.blocks(), self.model): ModulePolicyDescription(
                sub_module_replacement=subs, enter_tp_region=["attention"], per_rank_rng=["attention"]
            ),
            type(self.base): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("embed_in", self.shard_config)]
            ),
        }
        if hasattr(self.model, "lm_head"):
            policy[type(self.model)] = ModulePolicyDescription(
                sub_module_replacement=[vocab_head("lm_head", self.shard_config)]
            )
        return policy

    def postprocess(self):
        limit = self.model.config.max_position_embeddings

        def within_context(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            length = getattr(ids, "shape", (0, 0))[-1]
            if length > limit:
                raise ValueError(
                    f"{type(module).__name__}: a sequence of {length} tokens is longer than "
                    f"config.max_position_embeddings={limit}, GPT-NeoX's trained context: shorten it, or raise "
                    "max_position_embeddings in the config if the model was trained longer (shard-neox)"
                )

        # the plugin's own hook, placed by its declared constraints (no core edit): after every rank agreed
        # on the batch, before the meta guard
        attached(self.model).before_forward(
            self.model,
            "neox_context",
            within_context,
            with_kwargs=True,
            after="same_inputs",
            before="meta_guard",
            what="a sequence longer than max_position_embeddings refused",
        )
        return self.model
