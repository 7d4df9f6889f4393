"""Tiny Whisper models and real feature-extractor inputs from a synthesized waveform (fp32, dropout 0)."""

from __future__ import annotations

import math

import torch

SAMPLE_RATE = 16_000
MAX_SOURCE = 50  # encoder positions: 1 s of audio = 100 mel frames, halved by the second conv
VOCAB = 259  # not divisible by 2 or 4: the padded vocabulary must stay invisible


def config(heads: int = 4, d_model: int = 64, ffn: int = 128, **extra):
    from transformers import WhisperConfig

    cfg = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=80,
        d_model=d_model,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_source_positions=MAX_SOURCE,
        max_target_positions=64,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=3,
        suppress_tokens=[],
        begin_suppress_tokens=[],
        num_labels=3,
        # 5x Whisper's 0.02: with 0.02 attention is near uniform and the query projection's
        # gradient sits at the fp32 noise floor, where the kit cannot test it
        init_std=0.1,
        **extra,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def build(cls_name: str, **cfg):

    from transformers.models.whisper import modeling_whisper

    cls = getattr(modeling_whisper, cls_name)
    return cls(config(**cfg)).float()


def build_for_generation():
    """A conditional-generation model whose greedy tokens depend on the audio: every matrix drawn
    with std 0.5 (a deterministic generator), because with the usual init a random tiny Whisper
    repeats one token whatever it hears and a generation test could not see an encoder error."""
    model = build("WhisperForConditionalGeneration").eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    return model


def tone(freq: float, seconds: float = 1.0) -> torch.Tensor:
    """A synthesized waveform: a tone with a second harmonic and a slow amplitude envelope."""
    t = torch.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    env = 0.5 * (1 - torch.cos(2 * math.pi * t / seconds))
    return env * (0.6 * torch.sin(2 * math.pi * freq * t) + 0.3 * torch.sin(4 * math.pi * freq * t))


def input_features(batch: int = 2) -> torch.Tensor:
    """WhisperFeatureExtractor's log-mel output (80 bins x 100 frames) of synthesized tones."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=80, sampling_rate=SAMPLE_RATE, chunk_length=1)
    waves = [tone(220.0 * (i + 1)).numpy() for i in range(batch)]
    return extractor(waves, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features


def batch_for(cls_name: str) -> dict:
    feats = input_features()
    if cls_name in ("WhisperEncoder",):
        return {"input_features": feats}
    if cls_name == "WhisperForAudioClassification":
        return {"input_features": feats, "labels": torch.tensor([2, 0])}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, VOCAB, (2, 9), generator=g)
    ids[:, 0] = 3  # decoder start
    if cls_name == "WhisperModel":
        return {"input_features": feats, "decoder_input_ids": ids}
    return {"input_features": feats, "decoder_input_ids": ids[:, :-1], "labels": ids[:, 1:]}
