"""Tensor parallel for diffusers' 2-D diffusion transformers (DiT, PixArt): each ``BasicTransformerBlock``.

* Self-attention (``attn1``): ``to_q``, ``to_k``, ``to_v`` column parallel by heads (they read one
  tensor: one backward all-reduce for the three), ``to_out.0`` row parallel (one all-reduce
  forward); the attention's ``heads`` is set per rank, which is what diffusers' processors read to
  reshape. Cross-attention (``attn2``, PixArt's caption): the same, ``to_k`` / ``to_v`` reading the
  caption states, each entering the region on its own.
* Feed-forward (``ff.net``): the activation's projection ``net.0.proj`` column parallel, ``net.2``
  row parallel; the dropout between them (on split activations) draws from the per-rank stream.
* Everything else stays replicated: the patch embedding, the adaptive norms and their timestep /
  class embeddings, the caption projection, the output projections.

The model's own forward and processors run unchanged (no copied modeling code). Refused by name: a
block with q/k norms (``qk_norm``: its weights act on each rank's heads), a processor other than
diffusers' default ``AttnProcessor2_0`` / ``AttnProcessor`` (a fused or custom one may read whole
heads), heads or feed-forward width that the TP size does not divide.
"""

from __future__ import annotations

from shardcore.plugin_api import (
    ModulePolicyDescription,
    Policy,
    attention,
    block_type,
    blocks_in,
    mlp,
    require_divisible,
)

__all__ = ["DiTPolicy"]

#: diffusers' processors whose forward reshapes by ``attn.heads`` and calls ``to_q/k/v`` and ``to_out[0]``
_PROCESSORS = ("AttnProcessor2_0", "AttnProcessor")
_NAMES = ("to_q", "to_k", "to_v", "to_out.0")


class DiTPolicy(Policy):
    def blocks(self):
        return blocks_in(self.model, self.model.transformer_blocks)

    def _attentions(self, block) -> list[str]:
        return [name for name in ("attn1", "attn2") if getattr(block, name, None) is not None]

    def config_sanity_check(self) -> None:
        cfg, name = self.model.config, type(self.model).__name__
        require_divisible(cfg.num_attention_heads, self.tp_size, "num_attention_heads", name)
        block = self.model.transformer_blocks[0]
        require_divisible(block.ff.net[0].proj.out_features, self.tp_size, "the feed-forward width", name)
        if (
            self.shard_config.data_parallel in ("fsdp", "zero2", "hsdp")
            and getattr(block.norm1, "emb", None) is not None
        ):
            raise NotImplementedError(
                f"{name}: its forward calls transformer_blocks[0].norm1.emb again after the blocks (the output's "
                "conditioning), while FSDP holds a block's weights whole only inside that block's forward; use "
                "data_parallel='ddp' for this model"
            )
        for attn_name in self._attentions(block):
            attn = getattr(block, attn_name)
            processor = type(attn.processor).__name__
            if processor not in _PROCESSORS:
                raise NotImplementedError(
                    f"{name}: {attn_name} runs the processor {processor}, which shard-diffusers does not split by "
                    f"heads (it splits {', '.join(_PROCESSORS)}); call model.set_default_attn_processor() first"
                )
            if getattr(attn, "norm_q", None) is not None or getattr(attn, "norm_k", None) is not None:
                raise NotImplementedError(
                    f"{name}: {attn_name} normalizes q and k (qk_norm), whose weights act on each rank's heads; "
                    "not split by shard-diffusers yet (leave qk_norm off, or write a policy summing their gradients)"
                )

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        heads, head_dim = cfg.num_attention_heads, cfg.attention_head_dim
        block = self.model.transformer_blocks[0]
        attentions = self._attentions(block)
        subs = []
        for attn_name in attentions:
            subs += attention(attn_name, heads, head_dim, names=_NAMES, shared_input=attn_name == "attn1")
        subs += mlp("ff.net", ("0.proj",), "2")
        return {
            block_type(self.blocks(), self.model): ModulePolicyDescription(
                attribute_replacement={f"{a}.heads": heads // tp for a in attentions},
                sub_module_replacement=subs,
                enter_tp_region=["attn1"],  # q, k, v read one tensor: one backward all-reduce for the three
                per_rank_rng=["ff.net.1"],  # the dropout on the split feed-forward activations
            )
        }
