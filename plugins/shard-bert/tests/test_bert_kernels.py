"""shard-bert with the optimization switches, and ``shardcore explain`` against real steps."""

from __future__ import annotations

import pytest
from bert_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_explain_matches, run_on_ranks


def _explain(tp: int, cls_name: str) -> dict:
    return assert_explain_matches(lambda: build(cls_name), batch_for(cls_name), ShardConfig(tensor_parallel_size=tp))


@pytest.mark.parametrize("cls_name", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_explain_predicts_a_step(cls_name):
    """explain (meta device) predicts a real step's collectives by kind and rank 0's bytes."""
    reports = run_on_ranks(2, _explain, 2, cls_name)
    assert reports[0]["collectives_per_layer"]["BertLayer"] == {
        "forward": {"all_reduce": 2},
        "backward": {"all_reduce": 2},
    }
