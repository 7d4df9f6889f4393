"""Tiny CLIP configs and batches: random weights, fp32, dropout 0; the towers with different head counts."""

from __future__ import annotations

import torch

VOCAB = 1001
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "image_size": 16,
    "patch_size": 8,
}
TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 8,
    "num_hidden_layers": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 16,
    "eos_token_id": VOCAB - 1,  # the pooled output reads the last token (which attends to every other)
    "bos_token_id": 1,  # CLIP's own, 49406, lies outside the tiny vocabulary
}


def build(cls_name: str = "CLIPModel", **extra):
    """``extra`` overrides the tower's config (both towers' for ``CLIPModel``)."""
    import transformers

    vision, text = {**VISION, **extra}, {**TEXT, **extra}
    if cls_name == "CLIPModel":
        config = transformers.CLIPConfig(vision_config=vision, text_config=text, projection_dim=24)
    elif "Vision" in cls_name:
        config = transformers.CLIPVisionConfig(**vision, projection_dim=24)
    else:
        config = transformers.CLIPTextConfig(**text, projection_dim=24)
    config._attn_implementation = "sdpa"
    return getattr(transformers, cls_name)(config).float()


def batch_for(cls_name: str, seed: int = 1, rows: int = 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {}
    if "Text" not in cls_name:
        batch["pixel_values"] = torch.randn(rows, 3, 16, 16, generator=g)
    if "Vision" not in cls_name:
        ids = torch.randint(1, VOCAB - 1, (rows, 7), generator=g)
        ids[:, -1] = VOCAB - 1  # the end-of-text token the pooled output reads
        batch["input_ids"] = ids
    if cls_name == "CLIPModel":
        batch["return_loss"] = True
    return batch
