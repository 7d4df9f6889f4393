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

Pipeline stages (``WhisperForConditionalGeneration``): encoder and decoder layers are one list of
blocks cut into stages. The convolutional front end goes with the first encoder layer, the
encoder's final norm with its last layer, the decoder's positions with its first layer, its
final norm and ``proj_out`` with the last (the token embedding, tied to ``proj_out``, is looked
up on the first stage). Stages send ``(encoder states, decoder embeddings)`` until the decoder
starts, then ``(encoder output, decoder states)``: the encoder output reaches every
decoder stage (cross-attention) and its gradient flows back through them. Every stage runs the
model's own modules: the encoder on a later stage takes its hidden states in at its first held
layer (a forward pre-hook; the front end before it is a hole), the decoder on a later stage
takes them as ``decoder_inputs_embeds``.
"""

from __future__ import annotations

from torch import nn

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    SEQ2SEQ_GENERATE_REFUSAL,
    PipelineSpec,
    SequenceSpec,
    attention,
    blocks_in,
    mlp,
    require_divisible,
    seq2seq_stage_batch,
    seq2seq_stage_output,
    token_items,
    token_loss,
    vocab_embedding,
    vocab_head,
)

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
        return blocks_in(self.model, *(stack.layers for stack in self._stacks()))

    # -- sequence parallelism: the encoder's frames ----------------------------------------------

    def sequence(self):
        """Sequence parallelism over the encoder's frames (1500 in every released Whisper, which 2, 4
        and 5 divide), split at its first layer and gathered after its last: Megatron's split_gather,
        Ulysses and the ring (transformers 5's attention registry; bidirectional, so the ring's parts
        are contiguous). The decoder runs as plain tensor parallelism: its tokens are few, and its
        cross-attention reads the encoder's whole output."""
        encoders = [stack for stack in self._stacks() if not hasattr(stack, "embed_tokens")]
        heads = self.model.config.encoder_attention_heads
        return SequenceSpec(
            modes=("split_gather", "all_to_all", "ring_attn"),
            heads=(heads, heads),
            causal=False,
            # transformers 5's Whisper attention reads the registry at each call, though the class
            # leaves _supports_attention_backend unset
            routed=self._registry_attention(),
            # the whole encoder layer on the per-rank stream while split: its residual and activation
            # dropouts are functional (no module to name), its attention's is per rank already
            dropouts=("",),
            regions=[blocks_in(self.model, encoders[0].layers)] if encoders else [],
        )

    def _registry_attention(self) -> bool:
        import transformers  # the model is a transformers model: it is imported already

        return int(transformers.__version__.split(".")[0]) >= 5

    # -- pipeline parallelism (conditional generation) -------------------------------------------

    def pipeline(self):
        return PipelineSpec(
            ends=self._pp_ends(),
            zero_ends=self._pp_zero_ends(),
            inputs=self._pp_inputs,
            stage_forward=self._pp_stage_forward,
            output=seq2seq_stage_output,
            num_items=self._pp_num_items,
            loss=self._pp_loss,
            generate_refusal=SEQ2SEQ_GENERATE_REFUSAL,  # generate() runs the encoder outside the forward
        )

    def _encoder_decoder(self):
        name, cfg = type(self.model).__name__, self.model.config
        if not hasattr(self.model, "proj_out") or len(self._stacks()) != 2:
            raise NotImplementedError(f"pipeline stages are built for WhisperForConditionalGeneration, not {name}")
        if getattr(cfg, "apply_spec_augment", False):
            raise NotImplementedError(
                f"{name}: apply_spec_augment=True masks the features in WhisperModel.forward before the encoder, "
                "which a pipeline stage runs on its own; set apply_spec_augment=False"
            )
        return self._stacks()

    def _pp_ends(self):
        encoder, decoder = self._encoder_decoder()
        paths = {id(m): n for n, m in self.model.named_modules()}
        enc, dec, n_enc = paths[id(encoder)], paths[id(decoder)], len(encoder.layers)
        return {
            f"{enc}.conv1": "first",
            f"{enc}.conv2": "first",
            f"{enc}.embed_positions": "first",
            f"{enc}.layer_norm": n_enc - 1,  # with the last encoder layer
            # the token embedding on the first stage: later stages receive only floating-point states
            # (torch's stages infer shapes on uninitialised tensors, where token ids would not be valid)
            f"{dec}.embed_tokens": "first",
            f"{dec}.embed_positions": n_enc,  # with the first decoder layer
            f"{dec}.layer_norm": "last",
            "proj_out": "last",
        }

    def _pp_zero_ends(self):
        encoder, decoder = self._encoder_decoder()
        paths = {id(m): n for n, m in self.model.named_modules()}
        return {f"{paths[id(encoder)]}.embed_positions", f"{paths[id(decoder)]}.embed_positions"}

    def _pp_inputs(self, batch, training=True):
        batch = seq2seq_stage_batch(self.model, batch, training, "input_features")
        labels, ids = batch.get("labels"), batch.get("decoder_input_ids")
        if ids is None:  # as the model's forward does: the labels shifted right after the start token
            import sys

            cfg = self.model.config
            shift = sys.modules[type(self.model).__module__].shift_tokens_right
            ids = shift(labels, cfg.pad_token_id, cfg.decoder_start_token_id)
        return (batch["input_features"], ids), labels

    def _pp_stage_forward(self, inputs, *, first, last):
        from shardcore.plugin_api import PipelineHole

        encoder, decoder = self._encoder_decoder()
        x, y = inputs  # (features | encoder states | encoder output, decoder ids | embeddings | states)
        if first:
            y = decoder.embed_tokens(y)  # as the decoder would: it takes them as decoder_inputs_embeds
        held_encoder = [layer for layer in encoder.layers if not isinstance(layer, PipelineHole)]
        if held_encoder:
            x = self._encode(encoder, held_encoder[0], x, first)
        if all(isinstance(layer, PipelineHole) for layer in decoder.layers):
            return x, y
        from transformers.modeling_outputs import BaseModelOutput

        starts = not isinstance(decoder.embed_positions, PipelineHole)  # this stage adds the positions
        saved = decoder.dropout
        decoder.dropout = decoder.dropout if starts else 0.0  # the input dropout ran where the decoder started
        try:
            run = self.model if last else self.model.model
            encoded = BaseModelOutput(last_hidden_state=x)
            out = run(encoder_outputs=encoded, decoder_inputs_embeds=y, use_cache=False)
        finally:
            decoder.dropout = saved
        # the last stage: the logits, and the encoder output the model returns too (a forward through the stages)
        return (out.logits, x) if last else (x, out.last_hidden_state)

    def _encode(self, encoder, first_held, x, first: bool):
        """The encoder's own forward on this stage's layers. Later stages: the hidden states enter
        at the first held layer (the features the encoder checks are zeros, the front end a hole)."""
        if first:
            return encoder(input_features=x).last_hidden_state

        def enter(module, args, kwargs):
            if args:
                return (x, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": x}

        cfg = self.model.config
        frames = cfg.max_source_positions * encoder.conv1.stride[0] * encoder.conv2.stride[0]
        handle = first_held.register_forward_pre_hook(enter, with_kwargs=True)
        saved, encoder.dropout = encoder.dropout, 0.0  # the input dropout ran on the first stage
        try:
            return encoder(input_features=x.new_zeros(x.shape[0], cfg.num_mel_bins, frames)).last_hidden_state
        finally:
            handle.remove()
            encoder.dropout = saved

    def _pp_num_items(self, labels):
        return token_items(labels)

    def _pp_loss(self, output, labels, num_items):
        return token_loss(output[0], labels, num_items)  # (logits, encoder output)

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
            require_divisible(getattr(cfg, heads), tp, heads, name)
            require_divisible(getattr(cfg, ffn), tp, ffn, name)
        config = self.shard_config
        if config.enable_sequence_parallelism and config.pipeline_parallel_size > 1:
            raise NotImplementedError(
                f"{name}: sequence parallelism with pipeline stages is not built for Whisper (an encoder stage "
                "after the first takes its states in through a hook the split would run before); use one of them"
            )
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
