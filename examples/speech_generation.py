"""Whisper, tensor parallel, generating from one second of synthesized audio.

    pip install ./ ./plugins/shard-whisper
    torchrun --standalone --nproc_per_node 2 examples/speech_generation.py

A 440 Hz tone made here (no download) goes through Whisper's own feature extractor; the sharded
model's beam search gives the unsharded model's tokens
(``plugins/shard-whisper/tests/test_whisper_examples.py`` compares them).
"""

from __future__ import annotations

import argparse
import math

import torch
from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

import shardcore


def main(argv: list[str] | None = None) -> list[list[int]]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--unsharded", action="store_true", help="the same model, not sharded, for comparison")
    args = parser.parse_args(argv)
    tp = 1 if args.unsharded else args.tp

    # --8<-- [start:speech]
    sr = 16_000
    t = torch.arange(sr) / sr  # one second, synthesized here:
    wave = (0.6 * torch.sin(2 * math.pi * 440 * t)).numpy()  # a 440 Hz tone, no download
    features = WhisperFeatureExtractor(feature_size=80, chunk_length=1)(
        wave, sampling_rate=sr, return_tensors="pt"
    ).input_features

    config = WhisperConfig(
        d_model=256,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        max_source_positions=50,
    )  # 1 s of audio = 50 positions
    torch.manual_seed(0)
    model = shardcore.optimize(
        WhisperForConditionalGeneration(config).eval(), shardcore.ShardConfig(tensor_parallel_size=tp)
    )
    tokens = model.generate(features, max_new_tokens=20, num_beams=4)  # the unsharded model's tokens
    # --8<-- [end:speech]
    return tokens.tolist()


if __name__ == "__main__":
    print(main())
