"""The ViT row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny image classifier of 4 layers on
24 x 24 images: 9 patches and the class token, 10 tokens, which 2 ranks split (32 x 32's 17 do not)."""

import torch
from vit_cases import hf_build

IMAGE = 24


def _batch(rows: int) -> dict:
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(rows, 3, IMAGE, IMAGE, generator=g), "labels": torch.arange(rows) % 3}


CASES = {
    "vit": {
        "kit": {"zero_grads": ("*attention.k_proj.bias", "*attention.attention.key.bias")},
        "build": lambda: hf_build("ViTForImageClassification", layers=4, image=IMAGE),
        "batch": _batch,
    }
}
