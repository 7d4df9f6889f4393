"""Tensor parallel for Falcon: ``FalconModel``, ``FalconForCausalLM``, ``FalconForSequenceClassification``.

Falcon packs ``query_key_value`` in one of three layouts, each split so that a rank holds whole
heads and the model's own ``_split_heads`` reads its slice unchanged:

* multi-query (``multi_query=True``, Falcon-7B): ``[q (all heads); k; v]`` with one key/value
  head. The queries are split by heads, the one key/value head is replicated on every rank (its
  weight gradient summed over the group so the copies stay equal).
* grouped (``new_decoder_architecture=True``, Falcon-40B/180B): per key/value group
  ``[q of its heads; k; v]``; whole groups are split, ``num_kv_heads`` of them per rank (refused
  unless the group count divides the ranks).
* per head (neither): ``[q_h; k_h; v_h]`` for each head; whole heads are split.

``dense`` is row parallel; ``num_heads`` / ``num_kv_heads`` of the attention are set to this
rank's. The MLP's ``dense_h_to_4h`` is column and ``dense_4h_to_h`` row parallel. Parallel
attention (``parallel_attn``: attention and MLP read the same normed states, or two norms with
``num_ln_in_parallel_attn=2``) and the sequential layout both run the model's own decoder layer.

Positions: rotary (the default) needs nothing: cos/sin are per position, each rank rotates its
heads. ALiBi (``alibi=True``): the model builds the bias, and folds it into a per-head attention
mask, for every head before the blocks; a forward pre-hook on each attention cuts both to this
rank's heads, so each rank adds its own heads' slopes.

``word_embeddings`` is vocabulary parallel and the causal LM's ``lm_head`` (tied to it) a
vocabulary-parallel head gathering full logits, so the model's own loss and ``generate()`` run.
Replicated: the layer norms, a classifier's ``score``. Attention dropout draws per rank; the
residual dropouts (``dropout_add`` in the decoder layer) stay on the shared stream.
Structural: the classes are read off the model instance, nothing imports transformers.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore import SubModuleReplacementDescription as Sub
from shardcore.plugin_api import (
    FusedLinear1D_Col,
    HFStages,
    KernelSpec,
    Linear1D_Col,
    Linear1D_Row,
    SequenceSpec,
    StageFacts,
    block_type,
    blocks_in,
    heads_of_this_rank,
    in_blocks,
    mlp,
    require_divisible,
    vocab_embedding,
    vocab_head,
)

__all__ = ["FalconPolicy"]


#: under ALiBi, the bias (``[batch * heads, 1, keys]`` or ``[batch, heads, 1, keys]``) and the per-head
#: mask the model folded it into (``[batch, heads, queries, keys]``), cut to this rank's heads
_ALIBI = heads_of_this_rank("self_attention", "query_key_value", ("alibi", "attention_mask"))


class FalconPolicy(HFStages, Policy):
    """Every Falcon head: shards the base model (``model.transformer`` or the model itself); pipeline
    stages (the causal LM) on the model's own forward (rotary or ALiBi built on every stage)."""

    def stages(self):
        # FalconDecoderLayer returns (hidden, ...): the model reads outputs[0]
        return StageFacts(first_ends=("word_embeddings",), last_ends=("ln_f",), block_returns_tuple=True)

    def kernels(self):
        return KernelSpec(fusible=in_blocks(self.blocks(), "mlp"))  # dense_h_to_4h, GeLU, dense_4h_to_h

    def sequence(self):
        heads, kv, _ = self._dims()
        own = (
            "Falcon's attention is its own, not transformers' registry: it calls torch's "
            "scaled_dot_product_attention itself (or, with ALiBi, adds the bias of every head to its scores)"
        )
        return SequenceSpec(
            # Megatron's split: the attention runs on the gathered sequence (rotary cos / sin and the ALiBi
            # bias whole). Ulysses and the ring are refused, with the model's reason.
            modes=("split_gather",),
            refused={
                "all_to_all": f"{own}; routing that call (and the ALiBi slopes of a rank's heads) through the "
                "all-to-all is not built",
                "ring_attn": f"{own}; routing that call (and the ALiBi bias per travelling key block) around the "
                "ring is not built",
            },
            dropouts=("",),  # dropout_add on the residuals, in the decoder layer: this rank's tokens when split
            heads=(heads, kv),
        )

    @property
    def base(self):
        return self.model.base_model

    def blocks(self):
        return blocks_in(self.model, self.base.h)

    def _dims(self) -> tuple[int, int, int]:
        """(query heads, key/value heads of the packed projection, head_dim)."""
        cfg = self.model.config
        heads = cfg.num_attention_heads
        if cfg.new_decoder_architecture:
            kv = cfg.num_kv_heads
        else:
            kv = 1 if cfg.multi_query else heads
        return heads, kv, cfg.hidden_size // heads

    def config_sanity_check(self) -> None:
        cfg, name, tp = self.model.config, type(self.model).__name__, self.tp_size
        heads, kv, _ = self._dims()
        require_divisible(heads, tp, "num_attention_heads", name)
        require_divisible(cfg.ffn_hidden_size, tp, "ffn_hidden_size", name)
        if cfg.new_decoder_architecture and kv % tp:
            raise ValueError(
                f"{name}: new_decoder_architecture packs query_key_value by key/value group, and num_kv_heads={kv} "
                f"groups cannot be split over tensor_parallel_size={tp}; use a tensor_parallel_size that divides {kv}"
            )

    def _qkv(self) -> Sub:
        cfg = self.model.config
        heads, kv, head_dim = self._dims()
        suffix = "self_attention.query_key_value"
        if cfg.new_decoder_architecture:  # per group: [q of heads // kv heads; k; v]
            width = (heads // kv + 2) * head_dim
            return Sub(suffix=suffix, target_module=Linear1D_Col, kwargs={"num_heads": kv, "head_dim": width})
        if cfg.multi_query:  # [q; k; v], one key/value head replicated
            return Sub(
                suffix=suffix, target_module=FusedLinear1D_Col, kwargs={"heads": (heads, 1, 1), "head_dim": head_dim}
            )
        return Sub(suffix=suffix, target_module=Linear1D_Col, kwargs={"num_heads": heads, "head_dim": 3 * head_dim})

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        heads, kv, head_dim = self._dims()
        per_rank = {"self_attention.num_heads": heads // tp}
        per_rank["self_attention.num_kv_heads"] = (
            1 if cfg.multi_query and not cfg.new_decoder_architecture else kv // tp
        )
        policy = {
            block_type(self.blocks(), self.model): ModulePolicyDescription(
                attribute_replacement=per_rank,
                param_replacement=[_ALIBI] if cfg.alibi else [],
                sub_module_replacement=[
                    self._qkv(),
                    Sub(
                        suffix="self_attention.dense",
                        target_module=Linear1D_Row,
                        kwargs={"num_heads": heads, "head_dim": head_dim},
                    ),
                    *mlp("mlp", ("dense_h_to_4h",), "dense_4h_to_h"),
                ],
                per_rank_rng=["self_attention"],  # attention dropout drops this rank's heads
            ),
            type(self.base): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("word_embeddings", self.shard_config)]
            ),
        }
        if hasattr(self.model, "lm_head"):
            policy[type(self.model)] = ModulePolicyDescription(
                sub_module_replacement=[vocab_head("lm_head", self.shard_config)]
            )
        return policy
