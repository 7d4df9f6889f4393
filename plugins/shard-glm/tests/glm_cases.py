"""Tiny GLM / GLM-4 configs and batches: random weights, fp32, dropout 0, a vocabulary not divisible by 2 or 4."""

from __future__ import annotations

import torch

VOCAB = 1001


def build(cls_name: str = "GlmForCausalLM", **cfg):
    """``cls_name`` names a GLM or GLM-4 class (``Glm4ForCausalLM``...); its config is the family's."""
    import transformers

    family = "Glm4" if cls_name.startswith("Glm4") else "Glm"
    base = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # GLM-4-9B's grouping: replicated at TP=4
        "head_dim": 16,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "max_position_embeddings": 64,
        "initializer_range": 0.1,
    }
    config = getattr(transformers, f"{family}Config")(
        vocab_size=VOCAB, attention_dropout=0.0, pad_token_id=0, **{**base, **cfg}
    )
    config._attn_implementation = "sdpa"
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
