"""Tensor parallel for BLIP-2: ``Blip2ForConditionalGeneration`` and ``Blip2Model`` as composites of
``Blip2VisionModel``, ``Blip2QFormerModel`` and a language model, each part by its own policy.

* **Vision encoder** (:class:`Blip2VisionPolicy`): each layer's MLP, ``fc1`` column and ``fc2``
  row parallel. Its attention stays whole on every rank: ``Blip2Attention`` reshapes its packed
  ``qkv`` output with the *input's* full width (``embed_dim // num_heads``), which a rank holding
  some heads cannot match without a copied forward. (Replicated weights on replicated
  activations: every rank computes the same gradient, nothing to sum.)
* **Q-Former** (:class:`Blip2QFormerPolicy`): in every layer the self-attention's ``query`` /
  ``key`` / ``value`` column parallel by heads (one backward all-reduce for the three), its
  ``output.dense`` row parallel; the cross-attention (every ``cross_attention_frequency`` layers)
  the same, its key and value reading the vision encoder's output; the query tokens' feed-forward
  (``intermediate_query`` / ``output_query``, and the text tokens' where present) column then row.
  Each attention's ``num_attention_heads`` / ``all_head_size`` set to this rank's. Attention
  dropout draws per rank.
* **Language model**: whatever policy covers its class (shard-opt's ``OPTForCausalLM``,
  shard-t5's ``T5ForConditionalGeneration``), or the plan its config ships, found by
  :class:`shardcore.CompositePolicy` in the registry; nothing of theirs is copied.

Replicated: the vision embeddings, every layer norm, the query tokens, ``language_projection``.
"""

from __future__ import annotations

from torch import nn

from shardcore import CompositePolicy, ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    attention,
    block_type,
    blocks_in,
    mlp,
    require_divisible,
)

__all__ = ["Blip2Policy", "Blip2QFormerPolicy", "Blip2VisionPolicy"]

_QKVO = ("attention.query", "attention.key", "attention.value", "output.dense")


class Blip2VisionPolicy(Policy):
    """``Blip2VisionModel``: each encoder layer's MLP split, its attention whole (module docstring)."""

    def blocks(self):
        return blocks_in(self.model, self.model.encoder.layers)

    def config_sanity_check(self) -> None:
        cfg = self.model.config
        require_divisible(cfg.intermediate_size, self.tp_size, "intermediate_size", type(self.model).__name__)

    def module_policy(self):
        return {block_type(self.blocks(), self.model): ModulePolicyDescription(sub_module_replacement=mlp("mlp"))}


class Blip2QFormerPolicy(Policy):
    """``Blip2QFormerModel``: every layer's attention, cross-attention and feed-forward split (module docstring)."""

    def blocks(self):
        return blocks_in(self.model, self.model.encoder.layer)

    def config_sanity_check(self) -> None:
        cfg, name = self.model.config, type(self.model).__name__
        require_divisible(cfg.num_attention_heads, self.tp_size, "num_attention_heads", name)
        require_divisible(cfg.intermediate_size, self.tp_size, "intermediate_size", name)

    def module_policy(self):
        """One description of the encoder, layer by layer: only some layers hold a cross-attention."""
        cfg, tp = self.model.config, self.tp_size
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        attrs_, subs, regions, streams = {}, [], [], []
        for i, layer in enumerate(self.model.encoder.layer):
            at = f"layer.{i}"
            kinds = [("attention", True)] + ([("crossattention", False)] if layer.has_cross_attention else [])
            for kind, shared in kinds:
                attrs_[f"{at}.{kind}.attention.num_attention_heads"] = heads // tp
                attrs_[f"{at}.{kind}.attention.all_head_size"] = heads // tp * head_dim
                # the cross-attention's key and value read the image embeddings, its query the queries
                subs += attention(f"{at}.{kind}", heads, head_dim, names=_QKVO, shared_input=shared)
                streams.append(f"{at}.{kind}.attention")  # attention dropout drops this rank's heads
            regions.append(f"{at}.attention.attention")  # q, k, v read one tensor: one backward all-reduce
            subs += mlp(at, ("intermediate_query.dense",), "output_query.dense")
            if hasattr(layer, "intermediate"):  # the text tokens' feed-forward (an image-text matching Q-Former)
                subs += mlp(at, ("intermediate.dense",), "output.dense")
        return {
            type(self.model.encoder): ModulePolicyDescription(
                attribute_replacement=attrs_, sub_module_replacement=subs, enter_tp_region=regions, per_rank_rng=streams
            )
        }


class Blip2Policy(CompositePolicy):
    """BLIP-2: the vision encoder, the Q-Former and the language model, each by the policy covering it."""

    def parts(self):
        names = ("vision_model", "qformer", "language_model")
        return [name for name in names if isinstance(getattr(self.model, name, None), nn.Module)]
