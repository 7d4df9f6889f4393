"""Sharded GLM and GLM-4 against the unsharded model, on real gloo ranks (the kit does the checking)."""

from __future__ import annotations

import pytest
import torch
from glm_cases import batch_for, build

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


def _check(tp: int, cls_name: str) -> dict:  # module level: runs on every rank
    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name.endswith("Model") else {}
    return assert_sharded_matches(
        lambda: build(cls_name),
        batch_for(cls_name),
        ShardConfig(tensor_parallel_size=tp),
        max_param_fraction=0.6 if tp == 2 else None,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("tp", "cls_name"),
    [
        (2, "GlmForCausalLM"),
        (4, "GlmForCausalLM"),  # 2 key/value heads, each on 2 of the 4 ranks
        (2, "Glm4ForCausalLM"),
        (4, "Glm4ForCausalLM"),
        (2, "Glm4Model"),
        (2, "GlmForSequenceClassification"),
    ],
    ids=["glm-tp2", "glm-tp4", "glm4-tp2", "glm4-tp4", "glm4-model-tp2", "glm-classification-tp2"],
)
def test_matches_unsharded(tp, cls_name):
    for report in run_on_ranks(tp, _check, tp, cls_name):
        assert "max_abs_diff_after_steps" in report, report


def _generate(tp: int, cls_name: str):
    import shardcore

    torch.manual_seed(0)
    ref = build(cls_name, initializer_range=0.5).eval()  # larger weights: tokens that vary
    torch.manual_seed(0)
    model = shardcore.optimize(build(cls_name, initializer_range=0.5), ShardConfig(tensor_parallel_size=tp))
    prompt = {k: v for k, v in batch_for("GlmModel").items()}
    kwargs = {"max_new_tokens": 8, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    return assert_generate_matches(ref, model.eval(), **prompt, **kwargs).tolist()


@pytest.mark.parametrize("cls_name", ["GlmForCausalLM", "Glm4ForCausalLM"])
def test_generate_matches_unsharded(cls_name):
    tokens = run_on_ranks(2, _generate, 2, cls_name)
    assert tokens[0] == tokens[1]


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(
        lambda: build("Glm4ForCausalLM"), batch_for("Glm4ForCausalLM"), ShardConfig(tensor_parallel_size=tp), path
    )


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))


def _explain(tp: int) -> dict:
    return assert_explain_matches(build, batch_for("GlmForCausalLM"), ShardConfig(tensor_parallel_size=tp))


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind and bytes, and rank 0's bytes."""
    report = run_on_ranks(2, _explain, 2)[0]
    assert report["collectives_per_layer"]["GlmDecoderLayer"]["forward"] == {"all_reduce": 2}, report


def _refused(tp: int, cfg: dict) -> str:
    return refusal_message(lambda: build(**cfg), ShardConfig(tensor_parallel_size=tp))


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"num_attention_heads": 6, "num_key_value_heads": 6}, "num_attention_heads=6 is not divisible"),
        ({"intermediate_size": 130}, "intermediate_size=130 is not divisible"),
    ],
    ids=["heads", "intermediate"],
)
def test_refused_on_every_rank(cfg, message):
    assert all(message in m for m in run_on_ranks(4, _refused, 4, cfg))
