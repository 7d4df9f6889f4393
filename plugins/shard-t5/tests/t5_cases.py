"""Tiny T5-family configs and batches: random weights, fp32, dropout 0, a vocabulary not divisible by 2 or 4."""

from __future__ import annotations

import torch

VOCAB = 1001


def build(cls_name: str = "T5ForConditionalGeneration", family: str = "T5", *, untie: bool = False, **cfg):
    """``family`` is ``"T5"``, ``"MT5"`` or ``"UMT5"``; ``cls_name`` names the T5 class (its prefix is
    replaced). ``untie``: the head gets its own weight (v1.1 checkpoints; transformers 5 ties the
    head whatever the config says, so the test unties it as a user loading such weights would)."""
    import transformers

    base = {
        "d_model": 32,
        "d_kv": 8,
        "num_heads": 4,
        "d_ff": 64,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 16,
        "dropout_rate": 0.0,
        "initializer_factor": 1.0,
    }
    config = getattr(transformers, f"{family}Config")(vocab_size=VOCAB, decoder_start_token_id=0, **{**base, **cfg})
    config._attn_implementation = "eager"
    model = getattr(transformers, family + cls_name.removeprefix("T5"))(config).float()
    head = getattr(model, "lm_head", None)
    if untie and head is not None:  # scaled as a tied head's outputs are: logits of a few units
        head.weight = torch.nn.Parameter(head.weight.detach() * config.d_model**-0.5)
    return model


def batch_for(cls_name: str, seed: int = 1, rows: int = 2, target: int = 7, source: int = 9) -> dict:
    """``source`` ids with right padding on the first row (masked); ``target`` labels with -100 on its tail."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (rows, source), generator=g)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    ids[0, -3:] = 0  # T5's pad token
    batch = {"input_ids": ids, "attention_mask": mask}
    labels = torch.randint(2, VOCAB, (rows, target), generator=g)
    labels[0, -2:] = -100
    if cls_name.endswith("ForConditionalGeneration"):
        batch["labels"] = labels
    elif cls_name.endswith("T5Model"):
        batch["decoder_input_ids"] = labels.clamp(min=0)
    return batch
