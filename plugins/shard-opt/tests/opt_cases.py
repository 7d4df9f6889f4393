"""Tiny OPT configs and batches: random weights, fp32, dropout 0, a vocabulary not divisible by 2 or 4."""

from __future__ import annotations

import torch

VOCAB = 1001


def build(cls_name: str = "OPTForCausalLM", **cfg):
    import transformers

    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "ffn_dim": 128}
    config = transformers.OPTConfig(
        vocab_size=VOCAB, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, **{**base, **cfg}
    )
    config._attn_implementation = "sdpa"
    return getattr(transformers, cls_name)(config).float()


def batch_for(cls_name: str, seed: int = 1, rows: int = 2) -> dict:
    """Token ids with left padding on the first row (masked; its labels ignored)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (rows, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 1  # OPT's pad token
    batch = {"input_ids": ids, "attention_mask": mask}
    if cls_name.endswith("CausalLM"):
        batch["labels"] = ids.masked_fill(mask == 0, -100)
    elif cls_name.endswith("SequenceClassification"):
        batch["labels"] = torch.arange(rows) % 2
    return batch
