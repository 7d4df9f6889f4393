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

from torch import nn

from shardcore import ModulePolicyDescription, Policy
from shardcore.builders import attention, mlp, vocab_embedding, vocab_head
from shardcore.losses import defer_logits_gather, loss_on_head_slices
from shardcore.tensor_parallel import VocabParallelLMHead1D

__all__ = ["LlamaForCausalLMPolicy", "LlamaForSequenceClassificationPolicy", "LlamaModelPolicy", "LlamaPolicy"]


class LlamaPolicy(Policy):
    """Shared by every Llama-architecture head: shards the base model (``model.base_model``)."""

    #: Megatron sequence parallelism (norms and residuals on this rank's slice of the sequence) and
    #: Ulysses (each rank's tokens everywhere but attention, which an all-to-all turns to whole heads)
    sequence_parallelism_modes = ("split_gather", "all_to_all", "ring_attn")
    sequence_split_kwargs = ("position_embeddings",)  # rotary cos / sin along the sequence

    def sequence_parallel_heads(self):
        heads, kv, _ = self._dims()
        return heads, kv

    @property
    def base(self):
        return self.model.base_model

    def blocks(self):
        return self.blocks_in(self.base.layers)

    def _dims(self):
        cfg = self.model.config
        heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return heads, kv, head_dim

    def norm_classes(self):
        return (type(self.base.norm),)  # LlamaRMSNorm / MistralRMSNorm / Qwen2RMSNorm: weight * x / rms(x)

    def fusible_modules(self):
        return self.in_blocks("mlp")  # down(silu(gate(x)) * up(x)): SwiGLU fused

    def config_sanity_check(self) -> None:
        cfg, tp = self.model.config, self.tp_size
        name = type(self.model).__name__
        heads, kv, _ = self._dims()
        self.require_divisible(heads, tp, "num_attention_heads", name)
        self.require_divisible(cfg.intermediate_size, tp, "intermediate_size", name)
        if kv % tp and tp % kv:
            raise ValueError(
                f"{name}: num_key_value_heads={kv} can neither be split over nor replicated on "
                f"tensor_parallel_size={tp}; use a tensor_parallel_size that divides {kv} or is a multiple of it "
                f"(and divides num_attention_heads={heads})."
            )

    def module_policy(self):
        heads, kv, head_dim = self._dims()
        tp = self.tp_size
        local_kv = kv // tp if kv >= tp else 1
        layer_cls = self.block_type()
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

    # -- pipeline parallelism: stages run the model's own forward, hidden states as inputs_embeds ------

    def _base_prefix(self) -> str:
        path = next(n for n, m in self.model.named_modules() if m is self.base)
        return f"{path}." if path else ""

    def pipeline_ends(self):
        pre = self._base_prefix()
        ends = {f"{pre}embed_tokens": "first", f"{pre}norm": "last"}
        for head in ("lm_head", "score"):
            if isinstance(getattr(self.model, head, None), nn.Module):
                ends[head] = "last"
        return ends

    #: what a forward through the pipeline accepts besides the inputs: generate()'s bookkeeping
    _IGNORED = {"use_cache": (None, False), "past_key_values": (None,), "cache_position": None, "return_dict": None}

    def pipeline_inputs(self, batch, training=True):
        import torch

        batch = dict(batch)
        for key, allowed in self._IGNORED.items():
            if key in batch and not training and (allowed is None or batch[key] in allowed):
                batch.pop(key)
        known = {"input_ids", "attention_mask", "labels", "position_ids"}
        extra = sorted(set(batch) - known)
        if extra or "input_ids" not in batch or (training and "labels" not in batch):
            what = "pipeline_step" if training else "a forward through the pipeline"
            raise ValueError(
                f"{what} ({type(self.model).__name__}) takes input_ids, "
                + ("labels, " if training else "")
                + "and optionally attention_mask, position_ids"
                + ("" if training else ", labels")
                + f"; got {sorted(batch)}"
                + (f" ({extra} not supported through pipeline stages)" if extra else "")
            )
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask
        pos = batch.get("position_ids")
        pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1) if pos is None else pos  # the model's default
        return (ids, mask, pos), batch.get("labels")

    def _stage_body(self, inputs, first: bool):
        tokens, mask, pos = inputs
        entry = {"input_ids": tokens} if first else {"inputs_embeds": tokens}
        out = self.base(**entry, attention_mask=mask, position_ids=pos, use_cache=False)
        return out.last_hidden_state, mask, pos


class LlamaModelPolicy(LlamaPolicy):
    """``LlamaModel`` / ``MistralModel`` / ``Qwen2Model``: the decoder stack alone."""


class LlamaForCausalLMPolicy(LlamaPolicy):
    """``*ForCausalLM``: the base model plus a vocab-parallel ``lm_head``."""

    supports_parallel_output = True  # vocab-split logits, vocab-parallel cross entropy

    def module_policy(self):
        policy = super().module_policy()
        parallel_output = self.shard_config.parallel_output
        policy[type(self.model)] = ModulePolicyDescription(
            sub_module_replacement=[vocab_head("lm_head", self.shard_config, gather_output=not parallel_output)],
        )
        return policy

    def pipeline_stage_forward(self, inputs, *, first, last):
        if not last:
            return self._stage_body(inputs, first)
        hidden, mask, pos = inputs  # the last stage is never the first: a pipeline has two stages at least
        return self.model(inputs_embeds=hidden, attention_mask=mask, position_ids=pos, use_cache=False).logits

    def pipeline_output(self, output, loss):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        return CausalLMOutputWithPast(loss=loss, logits=output)

    def pipeline_num_items(self, labels):
        return (labels[..., 1:] != -100).sum()  # the shifted labels transformers' causal-LM loss counts

    def pipeline_loss(self, output, labels, num_items):
        cfg = self.model.config
        return self.model.loss_function(
            logits=output, labels=labels, vocab_size=cfg.vocab_size, num_items_in_batch=num_items
        )

    def postprocess(self):
        if self.shard_config.parallel_output:
            from .modeling import generate_needs_full_logits

            self.model.generate = generate_needs_full_logits
            if isinstance(self.model.lm_head, VocabParallelLMHead1D):  # the model's own forward, the loss on slices
                loss_on_head_slices(self.model, self.model.lm_head)
        else:  # the loss on the vocabulary slices while the logits are gathered
            defer_logits_gather(self.model, self.model.lm_head)
        return self.model


class LlamaForSequenceClassificationPolicy(LlamaPolicy):
    """``*ForSequenceClassification``: the base model; the small ``score`` head stays replicated."""
