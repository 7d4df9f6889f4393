"""Tensor parallel for Whisper: ``WhisperModel``, ``WhisperForConditionalGeneration``,
``WhisperForAudioClassification`` and ``WhisperEncoder`` on its own.

* Encoder and decoder self-attention: ``q_proj``/``k_proj``/``v_proj`` column parallel by heads
  (one backward all-reduce for the three), ``out_proj`` row parallel.
* Decoder cross-attention (``encoder_attn``): the same split; its query reads the decoder's
  states and its key/value the encoder's, each entering the parallel region on its own.
* ``fc1`` column, ``fc2`` row parallel, in every layer.
* The decoder's ``embed_tokens`` is vocab parallel and ``proj_out`` a vocab-parallel LM head
  tied to it (full logits gathered, so ``generate()`` works unchanged, greedy or beam search,
  with the self- and cross-attention KV caches holding this rank's heads).
* The convolutional front end, positional embeddings, norms and classification heads stay
  replicated. Attention dropout draws from a per-rank random stream.

Structural: the layer classes are found on the model instance, nothing imports transformers.
"""

from __future__ import annotations

from torch import nn

from shardcore import ModulePolicyDescription, Policy
from shardcore.builders import attention, mlp, vocab_embedding, vocab_head

__all__ = ["WhisperPolicy"]

_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")


def _is_layer(module) -> bool:
    return hasattr(module, "self_attn") and hasattr(module, "fc1")


class WhisperPolicy(Policy):
    def _stacks(self) -> list:
        """The encoder and decoder stacks present (modules holding ``layers`` of Whisper layers), in order."""
        return [
            m
            for m in self.model.modules()
            if isinstance(getattr(m, "layers", None), nn.ModuleList) and m.layers and all(map(_is_layer, m.layers))
        ]

    def blocks(self):
        """Encoder layers, then decoder layers (those present)."""
        return self.blocks_in(*(stack.layers for stack in self._stacks()))

    def _layers(self) -> tuple[type | None, type | None]:
        encoder = decoder = None
        for _, layer in self.blocks():
            if hasattr(layer, "encoder_attn"):
                decoder = decoder or type(layer)
            else:
                encoder = encoder or type(layer)
        if encoder is None and decoder is None:
            raise ValueError(f"{type(self.model).__name__}: no Whisper layers (self_attn, fc1) found to shard")
        return encoder, decoder

    def config_sanity_check(self) -> None:
        cfg, tp, name = self.model.config, self.tp_size, type(self.model).__name__
        encoder, decoder = self._layers()
        checks = [("encoder_attention_heads", "encoder_ffn_dim")] if encoder else []
        checks += [("decoder_attention_heads", "decoder_ffn_dim")] if decoder else []
        for heads, ffn in checks:
            self.require_divisible(getattr(cfg, heads), tp, heads, name)
            self.require_divisible(getattr(cfg, ffn), tp, ffn, name)
        if cfg.activation_dropout > 0:
            raise NotImplementedError(
                f"{name}: activation_dropout={cfg.activation_dropout} acts on the split MLP activations, which "
                "shard-whisper cannot give a per-rank random stream yet; set activation_dropout=0"
            )

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        encoder, decoder = self._layers()
        policy = {}
        if encoder is not None:
            h = cfg.encoder_attention_heads
            policy[encoder] = ModulePolicyDescription(
                # embed_dim: transformers 4.x reshapes the attention output to it
                attribute_replacement={"self_attn.num_heads": h // tp, "self_attn.embed_dim": cfg.d_model // tp},
                sub_module_replacement=attention("self_attn", h, cfg.d_model // h, names=_NAMES) + mlp(""),
                enter_tp_region=["self_attn"],
                per_rank_rng=["self_attn"],
            )
        if decoder is not None:
            h = cfg.decoder_attention_heads
            policy[decoder] = ModulePolicyDescription(
                attribute_replacement={
                    "self_attn.num_heads": h // tp,
                    "encoder_attn.num_heads": h // tp,
                    "self_attn.embed_dim": cfg.d_model // tp,
                    "encoder_attn.embed_dim": cfg.d_model // tp,
                },
                sub_module_replacement=attention("self_attn", h, cfg.d_model // h, names=_NAMES)
                # cross-attention: query from the decoder's states, key/value from the encoder's
                + attention("encoder_attn", h, cfg.d_model // h, names=_NAMES, shared_input=False)
                + mlp(""),
                enter_tp_region=["self_attn"],
                per_rank_rng=["self_attn", "encoder_attn"],
            )
            decoder_stack = next(s for s in self._stacks() if isinstance(s.layers[0], decoder))
            policy[type(decoder_stack)] = ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("embed_tokens", self.shard_config)]
            )
            if hasattr(self.model, "proj_out"):
                policy[type(self.model)] = ModulePolicyDescription(
                    sub_module_replacement=[vocab_head("proj_out", self.shard_config)]
                )
        return policy
