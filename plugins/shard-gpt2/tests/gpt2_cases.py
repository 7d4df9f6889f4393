"""Tiny GPT-2 models and batches for shard-gpt2's tests (random weights, fp32, dropout 0 unless asked)."""

from __future__ import annotations

import torch

VOCAB = 1001  # not divisible by 2 or 4: vocabulary padding must be invisible


def build(
    cls_name: str = "GPT2LMHeadModel", *, heads: int = 4, embd: int = 64, layers: int = 2, dropout: float = 0.0, **extra
):
    import transformers

    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=embd,
        n_layer=layers,
        n_head=heads,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        num_labels=3,
        pad_token_id=0,
        bos_token_id=None,  # GPT-2's 50256 lies outside the tiny vocabulary
        eos_token_id=None,
        # 5x GPT-2's 0.02: with 0.02 a random tiny model's greedy tokens do not depend on the
        # input (it emits one token forever), so a generation test could not fail
        initializer_range=0.1,
        **extra,
    )
    config._attn_implementation = "sdpa"
    return getattr(transformers, cls_name)(config).float()


def batch_for(cls_name: str, *, seed: int = 1, batch: int = 2, seq: int = 10) -> dict:
    """Token ids, the first row right-padded (masked; ignored by the loss), and labels for the head."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    ids[0, -3:], mask[0, -3:] = 0, 0
    out = {"input_ids": ids, "attention_mask": mask}
    if cls_name == "GPT2LMHeadModel":
        out["labels"] = ids.masked_fill(mask == 0, -100)
    elif cls_name == "GPT2ForSequenceClassification":
        out["labels"] = torch.tensor([2, 0])[:batch]
    return out
