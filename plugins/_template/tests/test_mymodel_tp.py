"""Sharded MyModel against the unsharded model, on real gloo ranks (the kit does the checking)."""

from __future__ import annotations

import pytest
from mymodel_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, hidden_state_loss, refusal_message, run_on_ranks


def _check(tp: int, cls_name: str) -> dict:  # module level: runs on every rank
    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name == "MyModel" else {}
    return assert_sharded_matches(
        lambda: build(cls_name), batch_for(cls_name), ShardConfig(tensor_parallel_size=tp), **kwargs
    )


@pytest.mark.parametrize("tp", [2, 4])  # TP=1 returns the model itself: tested once, in the core
@pytest.mark.parametrize("cls_name", ["MyModel", "MyModelForCausalLM"])
def test_matches_unsharded(tp, cls_name):
    run_on_ranks(tp, _check, tp, cls_name)


def _refused(tp: int) -> str:
    return refusal_message(lambda: build(num_attention_heads=6, hidden_size=48), ShardConfig(tensor_parallel_size=tp))


def test_heads_not_divisible_refused_on_every_rank():
    assert all("num_attention_heads=6 is not divisible" in m for m in run_on_ranks(4, _refused, 4))
