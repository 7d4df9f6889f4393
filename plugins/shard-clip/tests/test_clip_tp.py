"""Sharded CLIP against the unsharded model, on real gloo ranks (the kit does the checking)."""

from __future__ import annotations

import pytest
from clip_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_explain_matches,
    assert_save_pretrained_matches,
    assert_sharded_matches,
    hidden_state_loss,
    refusal_message,
    run_on_ranks,
)

LOSSES = {
    "CLIPVisionModel": ("last_hidden_state", "pooler_output"),
    "CLIPTextModel": ("last_hidden_state", "pooler_output"),
    "CLIPVisionModelWithProjection": ("image_embeds", "last_hidden_state"),
}


#: zero in exact arithmetic: a key bias adds the same q.b to every score of a query, which softmax ignores
ZERO_GRADS = ("*.self_attn.k_proj.bias",)


def _check(tp: int, cls_name: str) -> dict:  # module level: runs on every rank
    kwargs = {"loss_fn": hidden_state_loss(*LOSSES[cls_name])} if cls_name in LOSSES else {}
    return assert_sharded_matches(
        lambda: build(cls_name),
        batch_for(cls_name),
        ShardConfig(tensor_parallel_size=tp),
        zero_grads=ZERO_GRADS,
        # the 0.6 bound on the whole model: a tiny vision tower alone is mostly its replicated patch embedding
        max_param_fraction=0.6 if tp == 2 and cls_name == "CLIPModel" else None,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("tp", "cls_name"),
    [
        (2, "CLIPModel"),  # the contrastive loss over both towers (4 and 8 heads)
        (4, "CLIPModel"),
        (2, "CLIPVisionModel"),
        (2, "CLIPTextModel"),
        (4, "CLIPVisionModelWithProjection"),
    ],
    ids=["clip-tp2", "clip-tp4", "vision-tp2", "text-tp2", "vision-projection-tp4"],
)
def test_matches_unsharded(tp, cls_name):
    for report in run_on_ranks(tp, _check, tp, cls_name):
        assert "max_abs_diff_after_steps" in report, report


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(
        lambda: build(), batch_for("CLIPModel"), ShardConfig(tensor_parallel_size=tp), path
    )


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))


def _refused(tp: int) -> str:
    return refusal_message(
        lambda: build("CLIPVisionModel", num_attention_heads=2), ShardConfig(tensor_parallel_size=tp)
    )


def test_heads_not_divisible_refused_on_every_rank():
    assert all("num_attention_heads=2 is not divisible" in m for m in run_on_ranks(4, _refused, 4))


def _explain(tp: int) -> dict:
    name = "CLIPVisionModel"  # image inputs: the collectives by kind and rank 0's bytes (no token count to price)
    return assert_explain_matches(
        lambda: build(name),
        batch_for(name),
        ShardConfig(tensor_parallel_size=tp),
        loss_fn=hidden_state_loss(*LOSSES[name]),
    )


def test_explain_predicts_a_step():
    report = run_on_ranks(2, _explain, 2)[0]
    assert report["collectives_per_step"]["forward"] == {"all_reduce": 4}, report["collectives_per_step"]
