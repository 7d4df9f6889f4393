"""Tensor-parallel policies for Llama-architecture models (Llama, Mistral, Qwen2).

Per decoder layer (Megatron-LM's layout, one all-reduce after attention and one after the MLP):

* ``q_proj``, ``k_proj``, ``v_proj``: column parallel, split by heads; ``o_proj``: row parallel.
* ``gate_proj``, ``up_proj``: column parallel; ``down_proj``: row parallel.
* norms and rotary embeddings: replicated.

``embed_tokens`` is vocab parallel; the causal-LM ``lm_head`` is a vocab-parallel LM head that
gathers full logits (default) or, with ``parallel_output=True``, keeps them split and computes
the loss with the vocab-parallel cross entropy. Tied embeddings stay tied.

Grouped-query attention: with ``num_key_value_heads >= tp`` the KV heads are split like the
query heads. With fewer KV heads than ranks (``tp`` a multiple of ``num_key_value_heads``),
each KV head is *replicated* on the ``tp / num_key_value_heads`` ranks whose query heads use it;
its gradient is summed over those ranks so the copies stay equal.

The policies are structural: they find the decoder-layer and base-model classes on the model
instance, so they import nothing from transformers.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    HFStages,
    KernelSpec,
    SequenceSpec,
    StageFacts,
    TensorParallelSpec,
    VocabParallelLMHead1D,
    attached,
    attention,
    attention_dims,
    block_type,
    blocks_in,
    defer_logits_gather,
    in_blocks,
    loss_on_head_slices,
    mlp,
    require_divisible,
    require_kv_heads,
    vocab_embedding,
    vocab_head,
)

__all__ = ["LlamaForCausalLMPolicy", "LlamaForSequenceClassificationPolicy", "LlamaModelPolicy", "LlamaPolicy"]


# --8<-- [start:specs]
class LlamaPolicy(Policy):
    """Shared by every Llama-architecture head: shards the base model (``model.base_model``)."""

    def sequence(self):
        heads, kv, _ = self._dims()
        return SequenceSpec(
            # Megatron sequence parallelism (norms and residuals on this rank's slice of the sequence),
            # Ulysses (each rank's tokens everywhere but attention, which an all-to-all turns to whole
            # heads) and the ring (context parallelism)
            modes=("split_gather", "all_to_all", "ring_attn"),
            split_kwargs=("position_embeddings",),  # rotary cos / sin along the sequence
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
            norm_classes=(type(self.base.norm),),  # LlamaRMSNorm / MistralRMSNorm / Qwen2RMSNorm: weight * x / rms(x)
            fusible=in_blocks(self.blocks(), "mlp"),  # down(silu(gate(x)) * up(x)): SwiGLU fused
        )

    # --8<-- [end:specs]

    def config_sanity_check(self) -> None:
        cfg, tp = self.model.config, self.tp_size
        name = type(self.model).__name__
        heads, kv, _ = self._dims()
        require_divisible(heads, tp, "num_attention_heads", name)
        require_divisible(cfg.intermediate_size, tp, "intermediate_size", name)
        require_kv_heads(kv, heads, tp, name)

    def module_policy(self):
        heads, kv, head_dim = self._dims()
        tp = self.tp_size
        local_kv = kv // tp if kv >= tp else 1
        layer_cls = block_type(self.blocks(), self.model)
        return {
            layer_cls: ModulePolicyDescription(
                attribute_replacement={"self_attn.num_key_value_groups": (heads // tp) // local_kv},
                sub_module_replacement=attention("self_attn", heads, head_dim, kv_heads=kv)
                + mlp("mlp", ("gate_proj", "up_proj"), "down_proj", shared_input=True),
                # q/k/v read one tensor, gate/up another: one backward all-reduce each
                enter_tp_region=["self_attn", "mlp"],
                per_rank_rng=["self_attn"],  # attention dropout drops this rank's heads
            ),
            type(self.base): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("embed_tokens", self.shard_config)]
            ),
        }


class LlamaModelPolicy(LlamaPolicy):
    """``LlamaModel`` / ``MistralModel`` / ``Qwen2Model``: the decoder stack alone."""


class LlamaForCausalLMPolicy(HFStages, LlamaPolicy):
    """``*ForCausalLM``: the base model plus a vocab-parallel ``lm_head``; pipeline stages on the
    model's own forward (:class:`~shardcore.integrations.hf.stages.HFStages`)."""

    def stages(self):
        return StageFacts(first_ends=("embed_tokens",), last_ends=("norm",))

    def tensor_parallel(self):
        return TensorParallelSpec(parallel_output=True)  # vocab-split logits, vocab-parallel cross entropy

    def module_policy(self):
        policy = super().module_policy()
        parallel_output = self.shard_config.parallel_output
        policy[type(self.model)] = ModulePolicyDescription(
            sub_module_replacement=[vocab_head("lm_head", self.shard_config, gather_output=not parallel_output)],
        )
        return policy

    def postprocess(self):
        if self.shard_config.parallel_output:
            from .modeling import generate_needs_full_logits

            refuse = "generate() refused: it needs the full logits"
            attached(self.model).route(
                self.model, "generate", "parallel_output", lambda _: generate_needs_full_logits, what=refuse
            )
            if isinstance(self.model.lm_head, VocabParallelLMHead1D):  # the model's own forward, the loss on slices
                loss_on_head_slices(self.model, self.model.lm_head)
        else:  # the loss on the vocabulary slices while the logits are gathered
            defer_logits_gather(self.model, self.model.lm_head)
        return self.model


class LlamaForSequenceClassificationPolicy(LlamaPolicy):
    """``*ForSequenceClassification``: the base model; the small ``score`` head stays replicated."""
