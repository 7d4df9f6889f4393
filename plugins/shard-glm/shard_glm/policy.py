"""Tensor parallel for GLM and GLM-4: ``*Model``, ``*ForCausalLM``, ``*ForSequenceClassification``.

Per decoder layer (one all-reduce after the attention and one after the MLP, forward):

* ``q_proj``, ``k_proj``, ``v_proj`` column parallel by heads (their biases with them), ``o_proj``
  row parallel. Grouped-query attention: key/value heads split when they are at least the
  ranks, else each replicated on the ranks whose query heads use it (its gradient summed there);
  ``num_key_value_groups`` set to this rank's. Partial rotary embeddings act per head: nothing
  to change.
* ``gate_up_proj`` packs ``[gate; up]`` (the MLP's ``chunk(2)`` reads the halves): each half is
  split on its own, so rank ``r`` holds ``[gate_r; up_r]`` and its ``chunk(2)`` gives its own
  halves; ``down_proj`` is row parallel. (HuggingFace's plan gathers the packed output on every
  rank instead, ``colwise_gather_output`` + ``rowwise_split_input``: an all-gather per layer.)
* ``embed_tokens`` vocabulary parallel; the causal LM's ``lm_head`` a vocabulary-parallel head
  gathering full logits, so the model's own loss and ``generate()`` run.

Replicated: every norm (GLM-4's extra post-attention and post-MLP norms act on the reduced
outputs), the rotary embedding, a classifier's ``score``. Attention dropout draws per rank.
Structural: the classes are read off the model instance, nothing imports transformers.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore import SubModuleReplacementDescription as Sub
from shardcore.plugin_api import (
    FusedLinear1D_Col,
    HFStages,
    KernelSpec,
    Linear1D_Row,
    SequenceSpec,
    StageFacts,
    attention,
    attention_dims,
    block_type,
    blocks_in,
    in_blocks,
    require_divisible,
    require_kv_heads,
    vocab_embedding,
    vocab_head,
)

__all__ = ["GlmPolicy"]


class GlmPolicy(HFStages, Policy):
    """Every GLM / GLM-4 head: shards the base model (``model.model`` or the model itself); pipeline
    stages on the model's own forward (the embedding first, the final norm and head last)."""

    def stages(self):
        return StageFacts(first_ends=("embed_tokens",), last_ends=("norm",))

    def sequence(self):
        heads, kv, _ = self._dims()
        return SequenceSpec(
            # Megatron's split (norms and residuals on this rank's tokens), Ulysses and the ring: the
            # attention is HuggingFace's registry's, the rotary cos / sin split with the tokens
            modes=("split_gather", "all_to_all", "ring_attn"),
            split_kwargs=("position_embeddings",),
            heads=(heads, kv),
        )

    @property
    def base(self):
        return self.model.base_model

    def blocks(self):
        return blocks_in(self.model, self.base.layers)

    def _dims(self):
        return attention_dims(self.model.config)

    def kernels(self):
        return KernelSpec(
            norm_classes=(type(self.base.norm),),  # GlmRMSNorm / Glm4RMSNorm: weight * x / rms(x)
            fusible=in_blocks(self.blocks(), "mlp"),  # down(silu(gate) * up) of the packed gate_up: fused
        )

    def config_sanity_check(self) -> None:
        cfg, tp, name = self.model.config, self.tp_size, type(self.model).__name__
        heads, kv, _ = self._dims()
        require_divisible(heads, tp, "num_attention_heads", name)
        require_divisible(cfg.intermediate_size, tp, "intermediate_size", name)
        require_kv_heads(kv, heads, tp, name)

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        heads, kv, head_dim = self._dims()
        local_kv = kv // tp if kv >= tp else 1
        width = cfg.intermediate_size
        policy = {
            block_type(self.blocks(), self.model): ModulePolicyDescription(
                attribute_replacement={"self_attn.num_key_value_groups": (heads // tp) // local_kv},
                sub_module_replacement=[
                    *attention("self_attn", heads, head_dim, kv_heads=kv),
                    # [gate; up]: each half split on its own (two segments of width rows, one row each)
                    Sub(
                        suffix="mlp.gate_up_proj",
                        target_module=FusedLinear1D_Col,
                        kwargs={"heads": (width, width), "head_dim": 1},
                    ),
                    Sub(suffix="mlp.down_proj", target_module=Linear1D_Row),
                ],
                enter_tp_region=["self_attn"],  # q, k, v read one tensor: one backward all-reduce
                per_rank_rng=["self_attn"],  # attention dropout drops this rank's heads
            ),
            type(self.base): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("embed_tokens", self.shard_config)]
            ),
        }
        if hasattr(self.model, "lm_head"):
            policy[type(self.model)] = ModulePolicyDescription(
                sub_module_replacement=[vocab_head("lm_head", self.shard_config)]
            )
        return policy
