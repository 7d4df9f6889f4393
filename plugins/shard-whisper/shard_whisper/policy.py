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

from shardcore import ModulePolicyDescription, Policy, SubModuleReplacementDescription
from shardcore.layers import Linear1D_Col, Linear1D_Row, VocabParallelEmbedding1D, VocabParallelLMHead1D

__all__ = ["WhisperPolicy"]


def _attention(prefix: str, heads: int, head_dim: int, *, shared_input: bool) -> list[SubModuleReplacementDescription]:
    sub, kw = SubModuleReplacementDescription, {"num_heads": heads, "head_dim": head_dim}
    col = {**kw, "copy_input": not shared_input}
    return [
        sub(suffix=f"{prefix}.q_proj", target_module=Linear1D_Col, kwargs=col),
        sub(suffix=f"{prefix}.k_proj", target_module=Linear1D_Col, kwargs=col),
        sub(suffix=f"{prefix}.v_proj", target_module=Linear1D_Col, kwargs=col),
        sub(suffix=f"{prefix}.out_proj", target_module=Linear1D_Row, kwargs=kw),
    ]


class WhisperPolicy(Policy):
    def _layers(self) -> tuple[type | None, type | None]:
        encoder = decoder = None
        for module in self.model.modules():
            if hasattr(module, "self_attn") and hasattr(module, "fc1"):
                if hasattr(module, "encoder_attn"):
                    decoder = decoder or type(module)
                else:
                    encoder = encoder or type(module)
        return encoder, decoder

    def config_sanity_check(self) -> None:
        cfg, tp, name = self.model.config, self.tp_size, type(self.model).__name__
        encoder, decoder = self._layers()
        checks = [("encoder_attention_heads", "encoder_ffn_dim")] if encoder else []
        checks += [("decoder_attention_heads", "decoder_ffn_dim")] if decoder else []
        for heads, ffn in checks:
            self.require_divisible(getattr(cfg, heads), tp, heads, name)
            self.require_divisible(getattr(cfg, ffn), tp, ffn, name)
        if self.shard_config.parallel_output:
            raise NotImplementedError(
                f"{name}: shard-whisper does not support ShardConfig(parallel_output=True) yet; leave it False "
                "(logits are gathered, generate() works)."
            )
        if cfg.activation_dropout > 0:
            raise NotImplementedError(
                f"{name}: activation_dropout={cfg.activation_dropout} acts on the split MLP activations, which "
                "shard-whisper cannot give a per-rank random stream yet; set activation_dropout=0"
            )

    def module_policy(self):
        cfg, tp = self.model.config, self.tp_size
        encoder, decoder = self._layers()
        mlp = [
            SubModuleReplacementDescription(suffix="fc1", target_module=Linear1D_Col),
            SubModuleReplacementDescription(suffix="fc2", target_module=Linear1D_Row),
        ]
        policy = {}
        if encoder is not None:
            h = cfg.encoder_attention_heads
            policy[encoder] = ModulePolicyDescription(
                attribute_replacement={"self_attn.num_heads": h // tp},
                sub_module_replacement=_attention("self_attn", h, cfg.d_model // h, shared_input=True) + mlp,
                enter_tp_region=["self_attn"],
                per_rank_rng=["self_attn"],
            )
        if decoder is not None:
            h = cfg.decoder_attention_heads
            policy[decoder] = ModulePolicyDescription(
                attribute_replacement={"self_attn.num_heads": h // tp, "encoder_attn.num_heads": h // tp},
                sub_module_replacement=_attention("self_attn", h, cfg.d_model // h, shared_input=True)
                + _attention("encoder_attn", h, cfg.d_model // h, shared_input=False)
                + mlp,
                enter_tp_region=["self_attn"],
                per_rank_rng=["self_attn", "encoder_attn"],
            )
            divisible = {"make_vocab_size_divisible_by": self.shard_config.make_vocab_size_divisible_by}
            decoder_stack = next(m for m in self.model.modules() if hasattr(m, "embed_tokens") and hasattr(m, "layers"))
            policy[type(decoder_stack)] = ModulePolicyDescription(
                sub_module_replacement=[
                    SubModuleReplacementDescription(
                        suffix="embed_tokens", target_module=VocabParallelEmbedding1D, kwargs=divisible
                    )
                ]
            )
            if hasattr(self.model, "proj_out"):
                policy[type(self.model)] = ModulePolicyDescription(
                    sub_module_replacement=[
                        SubModuleReplacementDescription(
                            suffix="proj_out", target_module=VocabParallelLMHead1D, kwargs=divisible
                        )
                    ]
                )
        return policy
