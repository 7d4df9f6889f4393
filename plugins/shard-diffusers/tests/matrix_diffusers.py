"""The DiT row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny diffusion transformer."""

import torch
from diffusers_cases import build

from shardcore.testing import hidden_state_loss


def _batch(rows: int) -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(rows, 4, 8, 8, generator=g),
        "timestep": torch.arange(rows) * 100 + 10,
        "class_labels": torch.arange(rows) % 4,
    }


CASES = {
    "dit": {
        "kit": {"zero_grads": ("*.to_k.bias",)},
        "build": lambda: build("DiTTransformer2DModel"),
        "batch": _batch,
        "loss_fn": hidden_state_loss("sample"),
    }
}
