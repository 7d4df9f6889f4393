"""The ViT row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny image classifier of 4 layers."""

import torch
from vit_cases import IMAGE, hf_build


def _batch(rows: int) -> dict:
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(rows, 3, IMAGE, IMAGE, generator=g), "labels": torch.arange(rows) % 3}


CASES = {
    "vit": {
        "kit": {"zero_grads": ("*attention.k_proj.bias", "*attention.attention.key.bias")},
        "build": lambda: hf_build("ViTForImageClassification", layers=4),
        "batch": _batch,
    }
}
