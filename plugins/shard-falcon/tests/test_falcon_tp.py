"""Sharded Falcon against the unsharded model, on real gloo ranks (the kit does the checking)."""

from __future__ import annotations

import pytest
import torch
from falcon_cases import batch_for, build

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


def _check(tp: int, cls_name: str, layout: str, attn: str) -> dict:  # module level: runs on every rank
    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name == "FalconModel" else {}
    return assert_sharded_matches(
        lambda: build(cls_name, layout, attn),
        batch_for(cls_name),
        ShardConfig(tensor_parallel_size=tp),
        max_param_fraction=0.6 if tp == 2 else None,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("tp", "cls_name", "layout", "attn"),
    [
        (2, "FalconForCausalLM", "multi-query", "sdpa"),
        (4, "FalconForCausalLM", "multi-query", "sdpa"),  # the one key/value head on 4 ranks
        (2, "FalconForCausalLM", "grouped", "sdpa"),
        (2, "FalconForCausalLM", "per-head-alibi", "sdpa"),  # ALiBi folded into the per-head mask
        (4, "FalconForCausalLM", "per-head-alibi", "eager"),  # ALiBi added to the scores
        (2, "FalconModel", "grouped", "eager"),
        (2, "FalconForSequenceClassification", "multi-query", "sdpa"),
    ],
    ids=["mq-tp2", "mq-tp4", "grouped-tp2", "alibi-tp2", "alibi-eager-tp4", "model-tp2", "classification-tp2"],
)
def test_matches_unsharded(tp, cls_name, layout, attn):
    for report in run_on_ranks(tp, _check, tp, cls_name, layout, attn):
        assert "max_abs_diff_after_steps" in report, report


def _generate(tp: int, layout: str):
    import shardcore

    torch.manual_seed(0)
    ref = build(layout=layout, initializer_range=0.5).eval()  # larger weights: tokens that vary
    torch.manual_seed(0)
    model = shardcore.optimize(build(layout=layout, initializer_range=0.5), ShardConfig(tensor_parallel_size=tp))
    prompt = {k: v for k, v in batch_for("FalconModel").items()}
    kwargs = {"max_new_tokens": 8, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    return assert_generate_matches(ref, model.eval(), **prompt, **kwargs).tolist()


@pytest.mark.parametrize("layout", ["multi-query", "per-head-alibi"])
def test_generate_matches_unsharded(layout):
    tokens = run_on_ranks(2, _generate, 2, layout)
    assert tokens[0] == tokens[1]


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(
        lambda: build(layout="grouped"), batch_for("FalconForCausalLM"), ShardConfig(tensor_parallel_size=tp), path
    )


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))


def _explain(tp: int) -> dict:
    return assert_explain_matches(build, batch_for("FalconForCausalLM"), ShardConfig(tensor_parallel_size=tp))


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind and bytes, and rank 0's bytes."""
    report = run_on_ranks(2, _explain, 2)[0]
    assert report["collectives_per_layer"]["FalconDecoderLayer"]["forward"] == {"all_reduce": 2}, report


def _refused(tp: int, cfg: dict) -> str:
    return refusal_message(lambda: build(**cfg), ShardConfig(tensor_parallel_size=tp))


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"num_attention_heads": 6, "hidden_size": 48}, "num_attention_heads=6 is not divisible"),
        ({"layout": "grouped"}, "num_kv_heads=2 groups cannot be split over tensor_parallel_size=4"),
    ],
    ids=["heads", "groups"],
)
def test_refused_on_every_rank(cfg, message):
    assert all(message in m for m in run_on_ranks(4, _refused, 4, cfg))
