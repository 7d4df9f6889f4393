"""A plain nn.Module sharded with a user Policy matches the unsharded model (TP=1, 2, 4)."""

import pytest
from toy_models import ToyLM, ToyPolicy, toy_batch

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, run_on_ranks


def _check_toy(tp: int, vocab: int) -> dict:
    return assert_sharded_matches(
        lambda: ToyLM(vocab=vocab), toy_batch(vocab), ShardConfig(tensor_parallel_size=tp), policy=ToyPolicy
    )


@pytest.mark.parametrize("tp", [2, 4])  # TP=1 returns the model itself: tested once, in the core
@pytest.mark.parametrize("vocab", [128, 101])
def test_toy_model_matches_unsharded(tp, vocab):
    reports = run_on_ranks(tp, _check_toy, tp, vocab)
    assert all("max_abs_diff_outputs" in r for r in reports)


def test_tp1_returns_the_model_itself_whole():
    # what a TP=1 parity case would only show by comparing the model with its twin
    import torch

    import shardcore
    from shardcore.tensor_parallel import ParallelModule

    model = ToyLM(vocab=128)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert shardcore.optimize(model, ShardConfig(tensor_parallel_size=1), policy=ToyPolicy) is model
    assert not any(isinstance(m, ParallelModule) for m in model.modules())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
