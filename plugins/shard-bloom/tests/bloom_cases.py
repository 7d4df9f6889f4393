"""Tiny BLOOM configs and batches: random weights, fp32, dropout 0, a vocabulary not divisible by 2 or 4."""

from __future__ import annotations

import torch

VOCAB = 1001


def build(cls_name: str = "BloomForCausalLM", **cfg):
    import transformers

    base = {"hidden_size": 64, "n_head": 4, "n_layer": 2, "initializer_range": 0.1}
    config = transformers.BloomConfig(
        vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0, pad_token_id=0, **{**base, **cfg}
    )
    return getattr(transformers, cls_name)(config).float()


def batch_for(cls_name: str, seed: int = 1, rows: int = 2, mask: bool = True) -> dict:
    """Token ids with left padding on the first row (masked; its labels ignored); ``mask=False``:
    no attention mask (the model then builds ALiBi from the key length alone)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (rows, 10), generator=g)
    batch = {"input_ids": ids}
    if mask:
        attention = torch.ones_like(ids)
        attention[0, :3] = 0
        ids[0, :3] = 0  # the pad token
        batch["attention_mask"] = attention
    if cls_name.endswith("CausalLM"):
        batch["labels"] = ids.masked_fill(batch.get("attention_mask", torch.ones_like(ids)) == 0, -100)
    elif cls_name.endswith("SequenceClassification"):
        batch["labels"] = torch.arange(rows) % 2
    return batch
