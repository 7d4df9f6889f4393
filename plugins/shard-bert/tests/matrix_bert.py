"""The BERT row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny masked LM of 4 layers."""

import torch
from bert_cases import VOCAB, build


def _batch(rows: int) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (rows, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # right padding on the first row
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _dp_batch(rows: int) -> dict:
    """Every token a label and none padded: each data-parallel rank's mean loss weighs as the whole batch's."""
    b = _batch(rows)
    return {**b, "attention_mask": b["attention_mask"].new_ones(b["input_ids"].shape), "labels": b["input_ids"]}


CASES = {
    "bert": {
        "kit": {"zero_grads": ("*.self.key.bias",)},
        "build": lambda: build("BertForMaskedLM", layers=4),
        "batch": _batch,
        "dp_batch": _dp_batch,
    }
}
