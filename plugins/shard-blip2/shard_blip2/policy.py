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

Pipeline stages (``Blip2ForConditionalGeneration`` with a decoder-only language model): the
language model's layers cut into stages by its own policy's spec (shard-opt's), the vision
encoder, query tokens, Q-Former and projection whole on the first stage, which runs BLIP-2's own
forward (the pixels go to that stage only); later stages run the language model's stages.
"""

from __future__ import annotations

import functools

from torch import nn

from shardcore import CompositePolicy, ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    HFStages,
    PipelineSpec,
    StageFacts,
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

    # -- pipeline stages: the language model's layers; the vision side whole on the first stage --------

    #: generate() is BLIP-2's own: it encodes the image, then calls the language model's generate()
    _pp_generate_unsupported = (
        "BLIP-2's generate() encodes the image outside the model's forward and calls the language model's own "
        "generate(), which the pipeline cannot route yet"
    )

    def _language_stages(self):
        """The language model's policy, which runs its layers in stages (shard-opt's: HFStages)."""
        name = type(self.model).__name__
        if not getattr(self.model.config, "use_decoder_only_language_model", False) or not hasattr(
            self.model, "language_projection"
        ):
            raise NotImplementedError(
                f"{name}: pipeline stages are built for Blip2ForConditionalGeneration with a decoder-only language "
                "model (an encoder-decoder's encoder and decoder would both have to be cut)"
            )
        policy = self.part_policies()["language_model"]
        if not isinstance(policy, HFStages):
            raise NotImplementedError(
                f"{name}: its language model's policy ({type(policy).__name__}) runs no pipeline stages on the "
                "HuggingFace stage mixin (shardcore.plugin_api.HFStages)"
            )
        return policy

    def pipeline(self) -> PipelineSpec:
        """The language model's stages (its own spec, under ``language_model.``), with the vision
        encoder, the query tokens, the Q-Former and the projection on the first stage, which runs
        BLIP-2's own forward (the image's query outputs put in the prompt's image tokens)."""
        lm = self._language_stages()
        spec = lm.pipeline()
        ends = {f"language_model.{path}": where for path, where in spec.ends.items()}
        ends |= dict.fromkeys(("vision_model", "query_tokens", "qformer", "language_projection"), "first")

        def inputs(batch, training=True):
            batch = dict(batch)
            pixels = batch.pop("pixel_values", None)
            if pixels is None:
                raise ValueError(f"pipeline stages of {type(self.model).__name__} take pixel_values (the image)")
            (ids, *rest), labels = spec.inputs(batch, training)
            return (ids, *rest, pixels), labels

        return PipelineSpec(
            ends=ends,
            zero_ends={f"language_model.{path}" for path in spec.zero_ends},
            inputs=inputs,
            stage_forward=functools.partial(self._pp_stage_forward, spec, lm.stages()),
            output=spec.output,
            num_items=spec.num_items,
            loss=spec.loss,
            block_returns_tuple=spec.block_returns_tuple,
            generate_refusal=self._pp_generate_unsupported,
            blocks=lambda: [(n, b) for n, b in self.blocks() if n.startswith("language_model.")],
        )

    def _pp_stage_forward(self, spec: PipelineSpec, facts: StageFacts, inputs: tuple, *, first: bool, last: bool):
        if not first:  # the language model's own stage: it takes the hidden states as inputs_embeds
            return spec.stage_forward(inputs, first=False, last=last)
        ids, *rest, pixels = inputs
        kwargs = {**dict(zip(facts.inputs, rest, strict=True)), **facts.call}
        # BLIP-2's forward on the first stage: its language model's head is a hole there, so its
        # "logits" are the hidden states after this stage's layers
        out = self.model(input_ids=ids, pixel_values=pixels, **kwargs)
        return (out.logits, *rest)
