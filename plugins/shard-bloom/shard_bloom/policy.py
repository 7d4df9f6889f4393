"""Tensor parallel for BLOOM: ``BloomModel``, ``BloomForCausalLM``, ``BloomForSequenceClassification``.

Per block (Megatron's layout, one all-reduce after the attention and one after the MLP):

* ``query_key_value``: BLOOM packs it per head (``[q_h; k_h; v_h]`` for each head ``h``, which is
  what its ``view(..., heads, 3, head_dim)`` reads), so a column-parallel split by heads of
  ``3 * head_dim`` rows gives each rank whole heads' queries, keys and values; ``dense`` is row
  parallel. ``num_heads`` of the attention is set to this rank's heads.
* ALiBi: the model builds one bias for every head before the blocks (``[batch * heads, 1, keys]``);
  a forward pre-hook on each attention hands it this rank's heads' rows, so each rank adds its
  own heads' slopes, exactly the unsharded model's. The model's code is not copied or patched.
* ``dense_h_to_4h`` column, ``dense_4h_to_h`` row parallel.
* ``word_embeddings`` vocabulary parallel; the causal LM's ``lm_head`` (tied to it) a
  vocabulary-parallel head gathering full logits, so the model's own loss and ``generate()`` run.

Replicated: the embedding layer norm, every layer norm, a classifier's ``score``. The attention
probabilities' dropout draws per rank; the residual dropouts (``dropout_add``) stay on the
shared stream. Refused: ``pretraining_tp > 1`` with ``slow_but_exact=True`` (it slices ``dense``
by the full width).

Structural: the classes are read off the model instance, nothing imports transformers.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore import SubModuleReplacementDescription as Sub
from shardcore.plugin_api import (
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

__all__ = ["BloomPolicy"]


class BloomPolicy(HFStages, Policy):
    """Every BLOOM head: shards the base model (``model.transformer`` or the model itself); pipeline
    stages (the causal LM) on the model's own forward, each stage building ALiBi from the mask."""

    def stages(self):
        return StageFacts(
            first_ends=("word_embeddings", "word_embeddings_layernorm"),
            last_ends=("ln_f",),
            inputs={"attention_mask": "ones"},  # BLOOM takes no position ids: ALiBi reads the mask
            block_returns_tuple=True,  # BloomBlock returns (hidden, ...): the model reads outputs[0]
        )

    def kernels(self):
        return KernelSpec(fusible=in_blocks(self.blocks(), "mlp"))  # dense_h_to_4h, GeLU, dense_4h_to_h, dropout_add

    def sequence(self):
        heads = self.model.config.n_head
        own = (
            "BLOOM's attention is its own, not transformers' registry: its scores start from the ALiBi bias of "
            "every head (one slope a head) in one baddbmm over the whole key length"
        )
        return SequenceSpec(
            # Megatron's split: the attention runs on the gathered sequence, so the ALiBi bias (whole keys) is
            # the unsharded one. Ulysses and the ring are refused, with the model's reason.
            modes=("split_gather",),
            refused={
                "all_to_all": f"{own}; cutting the slopes to a rank's heads after the all-to-all is not built",
                "ring_attn": f"{own}; the bias per travelling key block (its key positions) is not built",
            },
            dropouts=("",),  # dropout_add on the residuals, inside the block: this rank's tokens when split
            heads=(heads, heads),
        )

    @property
    def base(self):
        return self.model.base_model

    def blocks(self):
        return blocks_in(self.model, self.base.h)

    def config_sanity_check(self) -> None:
        cfg, name = self.model.config, type(self.model).__name__
        require_divisible(cfg.n_head, self.tp_size, "n_head", name)
        require_divisible(4 * cfg.hidden_size, self.tp_size, "4 * hidden_size (the MLP width)", name)
        if cfg.pretraining_tp > 1 and cfg.slow_but_exact:
            raise NotImplementedError(
                f"{name}: slow_but_exact=True with pretraining_tp={cfg.pretraining_tp} slices the attention's and "
                "the MLP's output projections by the full width, which a rank holding some heads does not have; "
                "set slow_but_exact=False (the same result up to rounding)"
            )

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        heads = cfg.n_head
        head_dim = cfg.hidden_size // heads
        # [q_h; k_h; v_h] per head; its input enters the region with the attention's (below)
        qkv = {"num_heads": heads, "head_dim": 3 * head_dim, "copy_input": False}
        policy = {
            block_type(self.blocks(), self.model): ModulePolicyDescription(
                attribute_replacement={"self_attention.num_heads": heads // tp},
                param_replacement=[heads_of_this_rank("self_attention", "query_key_value", ("alibi",))],
                sub_module_replacement=[
                    Sub(suffix="self_attention.query_key_value", target_module=Linear1D_Col, kwargs=qkv),
                    Sub(
                        suffix="self_attention.dense",
                        target_module=Linear1D_Row,
                        kwargs={"num_heads": heads, "head_dim": head_dim},
                    ),
                    *mlp("mlp", ("dense_h_to_4h",), "dense_4h_to_h"),
                ],
                per_rank_rng=["self_attention.attention_dropout"],  # the probabilities of this rank's heads
                # the attention reads its query length off its input: under Megatron's split that input is
                # gathered whole when the attention is entered, not only when query_key_value is
                enter_tp_region=["self_attention"],
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
