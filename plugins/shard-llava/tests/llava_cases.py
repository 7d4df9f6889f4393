"""A tiny Llava (a CLIP vision tower, a Llama) and its batches: random weights, fp32, dropout 0."""

from __future__ import annotations

import torch

VOCAB = 1001
IMAGE = VOCAB - 1  # the image token's id
PATCHES = 4  # a 16 x 16 image in 8 x 8 patches (the class token dropped: the "default" strategy)


def build(cls_name: str = "LlavaForConditionalGeneration", **text):
    import transformers

    vision = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    vision.update(image_size=16, patch_size=8)
    language = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
    language.update({"num_hidden_layers": 2, "vocab_size": VOCAB, "pad_token_id": 0, **text})
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**vision),
        text_config=transformers.LlamaConfig(**language),
        image_token_id=IMAGE,
        image_seq_length=PATCHES,
        vision_feature_layer=-1,
    )
    config._attn_implementation = "sdpa"
    return getattr(transformers, cls_name)(config).float()


def batch_for(cls_name: str = "LlavaForConditionalGeneration", seed: int = 1, rows: int = 2, labels: bool = True):
    """An image's tokens then text, left padding on the first row (masked; its labels ignored)."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, IMAGE, (rows, 8), generator=g)
    ids = torch.cat([torch.full((rows, PATCHES), IMAGE), text], dim=1)
    mask = torch.ones_like(ids)
    ids = torch.cat([torch.zeros(rows, 2, dtype=ids.dtype), ids], dim=1)
    mask = torch.cat([torch.zeros(rows, 2, dtype=mask.dtype), mask], dim=1)
    mask[1:, :2] = 1  # only the first row is padded
    ids[1:, :2] = torch.randint(1, IMAGE, (rows - 1, 2), generator=g)
    batch = {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.randn(rows, 3, 16, 16, generator=g)}
    if labels and cls_name.endswith("ForConditionalGeneration"):
        batch["labels"] = ids.masked_fill((mask == 0) | (ids == IMAGE), -100)
    return batch
