"""Tiny MyModel configs and batches: random weights, fp32, dropout 0, a vocabulary not divisible by 2 or 4."""

from __future__ import annotations

import torch

VOCAB = 1001


def build(cls_name: str = "MyModelForCausalLM", **cfg):
    import mymodels

    config = mymodels.MyConfig(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_layers=2, **cfg)
    return getattr(mymodels, cls_name)(config).float()


def batch_for(cls_name: str, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, 10), generator=g)
    return {"input_ids": ids, "labels": ids} if cls_name.endswith("CausalLM") else {"input_ids": ids}
