"""Tensor-parallel policies for BERT and RoBERTa.

Per encoder layer (Megatron-LM's layout, one all-reduce after attention and one after the MLP):

* ``attention.self.query/key/value``: column parallel, split by heads (one backward all-reduce
  for the three); ``attention.output.dense``: row parallel;
* ``intermediate.dense``: column parallel; ``output.dense``: row parallel;
* decoders with ``add_cross_attention``: the same for ``crossattention`` (its key and value read
  the encoder's states);
* LayerNorms, position and token-type embeddings, pooler and classifier heads: replicated.

``word_embeddings`` is vocab parallel, and so is the MLM decoder (full logits gathered; the
vocabulary is padded invisibly); the decoder weight stays tied to the word embeddings and its
bias to the head's ``bias``. Attention dropout runs on a per-rank random stream (each rank drops
its own heads), residual dropout on the shared one (replicas stay equal).

The policies are structural (classes are taken from the model instance), so they import
nothing from transformers.
"""

from __future__ import annotations

from torch import nn

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    HFStages,
    KernelSpec,
    SequenceSpec,
    StageFacts,
    attention,
    block_type,
    blocks_in,
    in_blocks,
    mlp,
    require_divisible,
    vocab_embedding,
    vocab_head,
)

__all__ = ["BertModelPolicy", "BertPolicy", "BertWithLMHeadPolicy"]

_NAMES = ("self.query", "self.key", "self.value", "output.dense")


class BertPolicy(HFStages, Policy):
    """Shards the encoder and word embeddings of ``model.base_model`` (``BertModel``/``RobertaModel``)."""

    def stages(self):
        """Pipeline stages (masked LM, sequence classification) on the model's own forward."""
        classifier = self._head() == "classifier"
        return StageFacts(
            inputs={"attention_mask": "ones", "token_type_ids": "zeros"},
            call={},
            first_ends=("embeddings",),
            last_ends=("pooler",),  # when the model has one
            loss="classification" if classifier else "masked_lm",
            output="SequenceClassifierOutput" if classifier else "MaskedLMOutput",
        )

    @property
    def base(self):
        return self.model.base_model

    def blocks(self):
        return blocks_in(self.model, self.base.encoder.layer)

    def sequence(self):
        heads = self.model.config.num_attention_heads
        return SequenceSpec(
            # Megatron sequence parallelism (LayerNorms, residuals and their dropout on this rank's tokens),
            # Ulysses and the ring (transformers 5: attention through its registry)
            modes=("split_gather", "all_to_all", "ring_attn"),
            dropouts=("attention.output.dropout", "output.dropout", "crossattention.output.dropout"),
            heads=(heads, heads),
            # bidirectional unless built as a decoder: the ring splits the tokens in contiguous parts
            causal=bool(getattr(self.model.config, "is_decoder", False)),
        )

    def kernels(self):
        # bias + GeLU; bias + dropout + residual + LayerNorm (after the MLP and after attention)
        return KernelSpec(
            fusible=in_blocks(self.blocks(), "intermediate", "output", "attention.output", "crossattention.output")
        )

    def config_sanity_check(self) -> None:
        cfg, tp = self.model.config, self.tp_size
        name = type(self.model).__name__
        require_divisible(cfg.num_attention_heads, tp, "num_attention_heads", name)
        require_divisible(cfg.intermediate_size, tp, "intermediate_size", name)

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        heads, head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
        local = {"num_attention_heads": heads // tp, "all_head_size": cfg.hidden_size // tp}
        layer_cls = block_type(self.blocks(), self.model)
        cross = hasattr(self.blocks()[0][1], "crossattention")
        attention_parts = ["attention"] + (["crossattention"] if cross else [])
        subs = attention("attention", heads, head_dim, names=_NAMES)
        if cross:
            # query reads the decoder's states, key/value the encoder's: no shared entry
            subs += attention("crossattention", heads, head_dim, names=_NAMES, shared_input=False)
        subs += mlp("", ("intermediate.dense",), "output.dense")
        return {
            layer_cls: ModulePolicyDescription(
                attribute_replacement={f"{part}.self.{k}": v for part in attention_parts for k, v in local.items()},
                sub_module_replacement=subs,
                enter_tp_region=["attention.self"],
                per_rank_rng=[f"{part}.self" for part in attention_parts],
            ),
            type(self.base.embeddings): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("word_embeddings", self.shard_config)]
            ),
        }

    # -- pipeline parallelism (masked LM and sequence classification): the model's own forward, the
    # hidden states entering later stages as inputs_embeds past a skipped embedding module ---------------

    def _head(self) -> str:
        for head in ("cls", "lm_head"):  # BERT's / RoBERTa's masked-LM head
            if isinstance(getattr(self.model, head, None), nn.Module) and hasattr(self.model, "get_output_embeddings"):
                if type(self.model).__name__.endswith("ForMaskedLM"):
                    return head
        if type(self.model).__name__.endswith("ForSequenceClassification"):
            return "classifier"
        raise NotImplementedError(
            f"pipeline stages are built for *ForMaskedLM and *ForSequenceClassification, not {type(self.model).__name__}"
        )


class BertModelPolicy(BertPolicy):
    """``BertModel``/``RobertaModel`` and the heads that keep a small replicated classifier."""


class BertWithLMHeadPolicy(BertPolicy):
    """Models with an MLM/LM head (``decoder`` over the vocabulary): the decoder is vocab parallel."""

    def module_policy(self):
        policy = super().module_policy()
        vocab = self.model.config.vocab_size
        heads = {
            type(m)
            for m in self.model.modules()
            if isinstance(getattr(m, "decoder", None), nn.Linear) and m.decoder.out_features == vocab
        }
        if not heads:
            raise ValueError(f"{type(self.model).__name__}: no LM head with a 'decoder' over the vocabulary found")
        for head in heads:
            policy[head] = ModulePolicyDescription(sub_module_replacement=[vocab_head("decoder", self.shard_config)])
        return policy
