"""Tensor parallel for GPT-2: ``GPT2Model``, ``GPT2LMHeadModel``, ``GPT2ForSequenceClassification``.

GPT-2's linear layers are ``Conv1D``: weight stored ``[in, out]``. Per block (Megatron's layout,
one all-reduce after attention and one after the MLP):

* ``attn.c_attn`` packs ``[q; k; v]`` along its outputs: split *per head*
  (:class:`~shardcore.tensor_parallel.FusedConv1D_Col`), so rank ``r`` holds its heads' columns of q, of k
  and of v; ``attn.c_proj`` row parallel;
* ``mlp.c_fc`` column, ``mlp.c_proj`` row parallel;
* ``wte`` vocab parallel, the LM head a vocab-parallel head tied to it (full logits gathered, so
  ``generate()`` works unchanged); ``wpe``, the norms and the classification ``score`` replicated.

Parameters keep GPT-2's ``[in, out]`` layout, so gathered tensors and saved checkpoints are the
library's own. Attention dropout draws from a per-rank random stream; the residual dropout at
the end of the attention module goes back to the shared stream (replicas stay equal).
Structural: imports nothing from transformers.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    Conv1D_Col,
    Conv1D_Row,
    FusedConv1D_Col,
    HFStages,
    KernelSpec,
    SequenceSpec,
    StageFacts,
    block_type,
    blocks_in,
    defer_logits_gather,
    in_blocks,
    mlp,
    packed_attention,
    require_divisible,
    vocab_embedding,
    vocab_head,
)

__all__ = ["GPT2Policy"]


class GPT2Policy(HFStages, Policy):
    def stages(self):
        # pipeline stages (GPT2LMHeadModel) on the model's own forward: wte, wpe and the embedding
        # dropout on the first stage, ln_f and the head on the last; later stages add no position embedding
        return StageFacts(
            first_ends=("wte", "wpe", "drop"),
            last_ends=("ln_f",),
            zero_ends=("wpe",),
            output="CausalLMOutputWithCrossAttentions",
        )

    def sequence(self):
        heads = self.model.config.n_head
        return SequenceSpec(
            # Megatron sequence parallelism: norms, residuals and residual dropout on this rank's tokens;
            # all_to_all and the ring: transformers 5's attention registry
            modes=("split_gather", "all_to_all", "ring_attn"),
            dropouts=("attn.resid_dropout", "mlp.dropout"),
            heads=(heads, heads),
        )

    @property
    def base(self):
        return self.model.base_model

    def blocks(self):
        return blocks_in(self.model, self.base.h)

    def postprocess(self):
        # GPT2LMHeadModel: the loss on the vocabulary slices while the logits are gathered
        defer_logits_gather(self.model, getattr(self.model, "lm_head", None))
        return self.model

    def kernels(self):
        # c_fc, tanh-GeLU, c_proj, dropout: the GeLU's dozen ops fused
        return KernelSpec(fusible=in_blocks(self.blocks(), "mlp"))

    def config_sanity_check(self) -> None:
        cfg, tp, name = self.model.config, self.tp_size, type(self.model).__name__
        require_divisible(cfg.n_head, tp, "n_head", name)
        require_divisible(cfg.n_inner or 4 * cfg.n_embd, tp, "n_inner (4 x n_embd by default)", name)
        if cfg.add_cross_attention:
            raise NotImplementedError(
                f"{name}: shard-gpt2 does not shard cross-attention (add_cross_attention=True) yet; "
                "leave it False, or shard the decoder without it"
            )

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        heads, head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
        block_cls = block_type(self.blocks(), self.model)
        local = cfg.n_embd // tp
        policy = {
            block_cls: ModulePolicyDescription(
                # c_attn's output is split into q, k, v of ``split_size`` each; heads are counted from it
                attribute_replacement={
                    "attn.split_size": local,
                    "attn.embed_dim": local,
                    "attn.num_heads": heads // tp,
                },
                sub_module_replacement=packed_attention(
                    "attn", heads, head_dim, names=("c_attn", "c_proj"), fused=FusedConv1D_Col, row=Conv1D_Row
                )
                + mlp("mlp", ("c_fc",), "c_proj", column=Conv1D_Col, row=Conv1D_Row),
                per_rank_rng=["attn"],  # attention dropout drops this rank's heads
                shared_rng=["attn.resid_dropout"],  # ... but the residual dropout acts on replicated states
            ),
            type(self.base): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("wte", self.shard_config)]
            ),
        }
        if hasattr(self.model, "lm_head"):
            policy[type(self.model)] = ModulePolicyDescription(
                sub_module_replacement=[vocab_head("lm_head", self.shard_config)]
            )
        return policy
