"""Distributed checkpoints (torch.distributed.checkpoint) with resharding: save at TP=2, load at
TP=4 and TP=1 into a model built from another seed, keep training: on every rank, the same
numbers as an unsharded run that was never interrupted."""

from __future__ import annotations

import pytest
from toy_models import ToyLM, ToyPolicy, toy_batch

from shardcore import ShardConfig
from shardcore.testing import assert_resume_matches, run_on_ranks, train_and_save


def _loss(out):
    return out["loss"]


def _first_half(tp: int, path: str) -> None:
    batches = [toy_batch(seed=s) for s in range(2)]
    train_and_save(ToyLM, batches, ShardConfig(tensor_parallel_size=tp), path, policy=ToyPolicy, loss_fn=_loss)


def _second_half(tp: int, path: str) -> float:
    saved, rest = [toy_batch(seed=s) for s in range(2)], [toy_batch(seed=s) for s in range(2, 4)]
    return assert_resume_matches(
        ToyLM, saved, rest, ShardConfig(tensor_parallel_size=tp), path, policy=ToyPolicy, loss_fn=_loss
    )


@pytest.mark.parametrize("tp_after", [4, 1])
def test_save_at_tp2_resume_at_other_tp(tp_after, tmp_path):
    path = str(tmp_path / "dcp")
    run_on_ranks(2, _first_half, 2, path)
    assert all(diff <= 1e-5 for diff in run_on_ranks(tp_after, _second_half, tp_after, path))
