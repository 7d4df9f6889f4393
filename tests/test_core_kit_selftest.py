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


def test_kit_compares_outputs_at_any_depth_and_refuses_what_it_cannot():
    from transformers.cache_utils import DynamicCache

    from shardcore.testing.compare import _tensors

    cache = DynamicCache()
    cache.update(torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), layer_idx=0)
    out = {"logits": torch.ones(2), "nested": ((torch.ones(1), torch.ones(2)), [torch.ones(3)]), "cache": cache}
    found = _tensors(out)
    assert sorted(found) == ["cache.0.keys", "cache.0.values", "logits", "nested.0.0", "nested.0.1", "nested.1.0"]
    assert sorted(_tensors(out, skip=("cache", "nested"))) == ["logits"]
    with pytest.raises(AssertionError, match=r"output 'extra' is a object, which the kit cannot compare; leave it out"):
        _tensors({"logits": torch.ones(2), "extra": object()})
