"""Sharded SAM against the unsharded model, on real gloo ranks (the kit does the checking)."""

from __future__ import annotations

import pytest
from sam_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_explain_matches,
    assert_save_pretrained_matches,
    assert_sharded_matches,
    hidden_state_loss,
    refusal_message,
    run_on_ranks,
)

LOSS = hidden_state_loss("pred_masks", "iou_scores")
#: zero in exact arithmetic: a key bias adds the same q.b to every score of a query, which softmax ignores
ZERO_GRADS = ("*.k_proj.bias",)


def _check(tp: int, vision: dict) -> dict:  # module level: runs on every rank
    return assert_sharded_matches(
        lambda: build(**vision),
        batch_for(),
        ShardConfig(tensor_parallel_size=tp),
        loss_fn=LOSS,
        zero_grads=ZERO_GRADS,
        max_param_fraction=0.6 if tp == 2 else None,
    )


@pytest.mark.parametrize(
    ("tp", "vision"),
    [(2, {}), (4, {}), (2, {"use_rel_pos": False})],
    ids=["rel-pos-tp2", "rel-pos-tp4", "no-rel-pos-tp2"],
)
def test_matches_unsharded(tp, vision):
    for report in run_on_ranks(tp, _check, tp, vision):
        assert "max_abs_diff_after_steps" in report, report


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(build, batch_for(), ShardConfig(tensor_parallel_size=tp), path, loss_fn=LOSS)


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))


def _refused(tp: int) -> str:
    return refusal_message(lambda: build(num_attention_heads=2), ShardConfig(tensor_parallel_size=tp))


def test_heads_not_divisible_refused_on_every_rank():
    assert all("vision_config.num_attention_heads=2 is not divisible" in m for m in run_on_ranks(4, _refused, 4))


def _explain(tp: int) -> dict:
    return assert_explain_matches(build, batch_for(), ShardConfig(tensor_parallel_size=tp), loss_fn=LOSS)


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind (the summed relative-position
    gradients among them) and rank 0's bytes."""
    report = run_on_ranks(2, _explain, 2)[0]
    assert report["collectives_per_step"]["backward"]["all_reduce"] > 0, report["collectives_per_step"]
