"""Batches for tiny text models: what the kit's callers (plugins' tests, ``nox -s matrix``) feed them."""

from __future__ import annotations

import torch

__all__ = ["token_batch"]


def token_batch(vocab: int, rows: int = 2, seq: int = 16, *, seed: int = 1, pad: bool = True) -> dict:
    """``input_ids``, ``attention_mask`` and causal-LM ``labels`` (the ids) of ``rows`` sequences of
    ``seq`` tokens in ``[1, vocab)``. ``pad``: the first row's first 3 tokens are left padding (token 0,
    masked, labels -100), so a family's masks and its loss's ignored tokens are exercised."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, seq), generator=g)
    mask = torch.ones_like(ids)
    if pad:
        mask[0, :3] = 0
        ids[0, :3] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
