"""BERT under FSDP2 x TP on 4 gloo ranks: each data-parallel rank trains on its half of the batch,
together like the unsharded model on the whole batch."""

from __future__ import annotations

import torch
from bert_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_data_parallel_matches, run_on_ranks


def _check() -> dict:
    # 4 examples, one label each: both halves hold two loss terms, so the mean of the halves'
    # mean losses is the whole batch's
    a, b = batch_for("BertForSequenceClassification", 1), batch_for("BertForSequenceClassification", 2)
    batch = {k: torch.cat([a[k], b[k]]) for k in a}
    return assert_data_parallel_matches(
        lambda: build("BertForSequenceClassification"),
        batch,
        ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="fsdp"),
        zero_grads=("*.self.key.bias",),  # softmax ignores a shift of every key
    )


def test_sequence_classification_fsdp2_x_tp2():
    for report in run_on_ranks(4, _check):
        # the position / token-type embeddings and LayerNorms are replicated over TP: above 1/4
        assert 0.25 <= report["state_fraction"] <= 0.30, report
