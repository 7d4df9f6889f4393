"""The kit must fail: deliberately wrong sharded models, each caught by the kit's own check with
its own message (the mutation harness loosens the kit and expects these tests to fail)."""

from __future__ import annotations

import pytest
import torch
from toy_models import ToyLM, ToyPolicy, toy_batch

from shardcore import ShardConfig
from shardcore.testing import RankError, assert_sharded_matches, run_on_ranks


class _GradientOff(ToyPolicy):
    """Sharded right, but block 0's first norm weight gets a gradient 1% too large on every rank."""

    def postprocess(self):
        model = super().postprocess()
        model.blocks[0].norm1.weight.register_hook(lambda g: g * 1.01)
        return model


class _SliceOff(ToyPolicy):
    """Each rank's slice of block 0's fc1 weight is nudged after sharding (the outputs stay close);
    on every rank, so that no rank goes on into a collective the failed ones never join."""

    def postprocess(self):
        model = super().postprocess()
        with torch.no_grad():
            model.blocks[0].fc1.weight[0, 0] += 1e-3
        return model


def _check(policy) -> dict:
    return assert_sharded_matches(
        lambda: ToyLM(vocab=128), toy_batch(128), ShardConfig(tensor_parallel_size=2), policy=policy
    )


def test_kit_passes_the_right_model():
    assert all(r["max_rel_err_grads"] <= 1e-4 for r in run_on_ranks(2, _check, ToyPolicy))


def test_kit_fails_on_a_gradient_one_percent_off():
    with pytest.raises(RankError, match=r"gradient of blocks\.0\.norm1\.weight \(gathered\): relative error"):
        run_on_ranks(2, _check, _GradientOff)


def test_kit_fails_on_one_ranks_slice():
    with pytest.raises(RankError, match=r"blocks\.0\.fc1\.weight: this rank's tensor is not its slice"):
        run_on_ranks(2, _check, _SliceOff)
