"""Tiny Falcon configs and batches: random weights, fp32, dropout 0, a vocabulary not divisible by 2 or 4."""

from __future__ import annotations

import torch

VOCAB = 1001

#: the three packings of query_key_value, and the two position schemes
LAYOUTS = {
    "multi-query": {},  # Falcon-7B: one key/value head, parallel attention, rotary
    "grouped": {"new_decoder_architecture": True, "num_kv_heads": 2, "num_ln_in_parallel_attn": 2},  # 40B / 180B
    "per-head-alibi": {"multi_query": False, "alibi": True, "parallel_attn": False},  # RW-style, sequential
}


def build(cls_name: str = "FalconForCausalLM", layout: str = "multi-query", attn: str = "sdpa", **cfg):
    import transformers

    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "initializer_range": 0.1}
    config = transformers.FalconConfig(
        vocab_size=VOCAB,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        pad_token_id=0,
        **{**base, **LAYOUTS[layout], **cfg},
    )
    config._attn_implementation = attn
    return getattr(transformers, cls_name)(config).float()


def batch_for(cls_name: str, seed: int = 1, rows: int = 2) -> dict:
    """Token ids with left padding on the first row (masked; its labels ignored)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (rows, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 0  # the pad token
    batch = {"input_ids": ids, "attention_mask": mask}
    if cls_name.endswith("CausalLM"):
        batch["labels"] = ids.masked_fill(mask == 0, -100)
    elif cls_name.endswith("SequenceClassification"):
        batch["labels"] = torch.arange(rows) % 2
    return batch
