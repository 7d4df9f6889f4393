"""A plain nn.Module sharded with a user Policy matches the unsharded model (TP=1, 2, 4)."""

import pytest
from toy_models import ToyLM, ToyPolicy, toy_batch

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, run_on_ranks


def _check_toy(tp: int, vocab: int) -> dict:
    return assert_sharded_matches(
        lambda: ToyLM(vocab=vocab), toy_batch(vocab), ShardConfig(tensor_parallel_size=tp), policy=ToyPolicy
    )


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("vocab", [128, 101])
def test_toy_model_matches_unsharded(tp, vocab):
    reports = run_on_ranks(tp, _check_toy, tp, vocab)
    assert all(r["max_abs_diff_outputs"] <= 1e-5 for r in reports)
