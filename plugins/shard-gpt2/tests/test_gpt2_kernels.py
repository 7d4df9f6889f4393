"""shard-gpt2 with the optimization switches, and ``shardcore explain`` against real steps."""

from __future__ import annotations

from gpt2_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_explain_matches, run_on_ranks


def _explain(tp: int) -> dict:
    return assert_explain_matches(
        lambda: build("GPT2LMHeadModel"), batch_for("GPT2LMHeadModel"), ShardConfig(tensor_parallel_size=tp)
    )


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind and rank 0's bytes."""
    (report, _) = run_on_ranks(2, _explain, 2)
    assert report["collectives_per_layer"]["GPT2Block"] == {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}
