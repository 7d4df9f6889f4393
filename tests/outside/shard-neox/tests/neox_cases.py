"""Tiny GPT-NeoX configs and batches: random weights, fp32, dropout 0, a vocabulary not divisible by 2 or 4."""

from __future__ import annotations

import torch

VOCAB = 1001


def build(cls_name: str = "GPTNeoXForCausalLM", **cfg):
    import transformers

    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128}
    config = transformers.GPTNeoXConfig(vocab_size=VOCAB, max_position_embeddings=64, **{**base, **cfg})
    config._attn_implementation = "sdpa"
    return getattr(transformers, cls_name)(config).float()


def batch_for(cls_name: str = "GPTNeoXForCausalLM", seed: int = 1, rows: int = 2, seq: int = 12) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, seq), generator=g)
    return {"input_ids": ids, "labels": ids} if cls_name.endswith("CausalLM") else {"input_ids": ids}
