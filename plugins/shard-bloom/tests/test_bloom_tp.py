"""Sharded BLOOM against the unsharded model, on real gloo ranks (the kit does the checking)."""

from __future__ import annotations

import pytest
import torch
from bloom_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_explain_matches,
    assert_generate_matches,
    assert_save_pretrained_matches,
    assert_sharded_matches,
    hidden_state_loss,
    refusal_message,
    run_on_ranks,
)


def _check(tp: int, cls_name: str, mask: bool) -> dict:  # module level: runs on every rank
    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name == "BloomModel" else {}
    return assert_sharded_matches(
        lambda: build(cls_name),
        batch_for(cls_name, mask=mask),
        ShardConfig(tensor_parallel_size=tp),
        max_param_fraction=0.6 if tp == 2 else None,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("tp", "cls_name", "mask"),
    [
        (2, "BloomForCausalLM", True),
        (4, "BloomForCausalLM", True),
        (2, "BloomForCausalLM", False),  # ALiBi built from the key length, not the mask
        (2, "BloomModel", True),
        (4, "BloomForSequenceClassification", True),
    ],
    ids=["causal-tp2", "causal-tp4", "no-mask-tp2", "model-tp2", "classification-tp4"],
)
def test_matches_unsharded(tp, cls_name, mask):
    for report in run_on_ranks(tp, _check, tp, cls_name, mask):
        assert "max_abs_diff_after_steps" in report, report


def _generate(tp: int):
    import shardcore

    torch.manual_seed(0)
    ref = build(initializer_range=0.5).eval()  # larger weights: tokens that vary, so the check can fail
    torch.manual_seed(0)
    model = shardcore.optimize(build(initializer_range=0.5), ShardConfig(tensor_parallel_size=tp)).eval()
    prompt = {k: v for k, v in batch_for("BloomModel").items()}
    kwargs = {"max_new_tokens": 8, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    return assert_generate_matches(ref, model, **prompt, **kwargs).tolist()


def test_generate_matches_unsharded():
    tokens = run_on_ranks(2, _generate, 2)
    assert tokens[0] == tokens[1]


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(
        lambda: build(), batch_for("BloomForCausalLM"), ShardConfig(tensor_parallel_size=tp), path
    )


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))


def _explain(tp: int) -> dict:
    return assert_explain_matches(build, batch_for("BloomForCausalLM"), ShardConfig(tensor_parallel_size=tp))


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind and bytes, and rank 0's bytes."""
    report = run_on_ranks(2, _explain, 2)[0]
    assert report["collectives_per_layer"]["BloomBlock"]["forward"] == {"all_reduce": 2}, report


def _refused(tp: int, cfg: dict) -> str:
    return refusal_message(lambda: build(**cfg), ShardConfig(tensor_parallel_size=tp))


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"n_head": 6, "hidden_size": 48}, "n_head=6 is not divisible"),
        ({"pretraining_tp": 2, "slow_but_exact": True}, "set slow_but_exact=False"),
    ],
    ids=["heads", "slow-but-exact"],
)
def test_refused_on_every_rank(cfg, message):
    assert all(message in m for m in run_on_ranks(4, _refused, 4, cfg))
