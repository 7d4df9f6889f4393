"""Sharded OPT against the unsharded model, on real gloo ranks (the kit does the checking)."""

from __future__ import annotations

import pytest
import torch
from opt_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_generate_matches,
    assert_pipeline_matches,
    assert_sharded_matches,
    hidden_state_loss,
    refusal_message,
    run_on_ranks,
)

# --8<-- [start:kit]
#: zero in exact arithmetic: a key bias adds the same q.b to every score of a query, which softmax ignores
ZERO_GRADS = ("*.self_attn.k_proj.bias",)


def _check(tp: int, cls_name: str, cfg: dict) -> dict:  # module level: runs on every rank
    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name == "OPTModel" else {}
    return assert_sharded_matches(
        lambda: build(cls_name, **cfg),
        batch_for(cls_name),
        ShardConfig(tensor_parallel_size=tp),
        zero_grads=ZERO_GRADS,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("tp", "cls_name", "cfg"),
    [
        (2, "OPTForCausalLM", {}),
        (4, "OPTForCausalLM", {}),
        (2, "OPTModel", {}),
        (2, "OPTForSequenceClassification", {}),
        # OPT-350m's layout: layer norm after each block, embeddings narrower than the blocks (no norm
        # before the first attention: weights larger than OPT's 0.02 so that its key gradients are testable)
        (2, "OPTForCausalLM", {"do_layer_norm_before": False, "word_embed_proj_dim": 32, "init_std": 0.1}),
    ],
    ids=["causal-tp2", "causal-tp4", "model-tp2", "classification-tp2", "post-norm-projected-tp2"],
)
def test_matches_unsharded(tp, cls_name, cfg):
    for report in run_on_ranks(tp, _check, tp, cls_name, cfg):
        assert "max_abs_diff_after_steps" in report, report


# --8<-- [end:kit]


def _generate(tp: int):
    import shardcore

    torch.manual_seed(0)
    ref = build(init_std=0.3).eval()  # larger than OPT's 0.02: tokens that vary, so the check can fail
    torch.manual_seed(0)
    model = shardcore.optimize(build(init_std=0.3), ShardConfig(tensor_parallel_size=tp)).eval()
    prompt = batch_for("OPTModel", rows=2)
    kwargs = {"max_new_tokens": 8, "do_sample": False, "use_cache": True, "pad_token_id": 1}
    return assert_generate_matches(ref, model, **prompt, **kwargs).tolist()


def test_generate_matches_unsharded():
    tokens = run_on_ranks(2, _generate, 2)
    assert tokens[0] == tokens[1]


def _pipeline(pp: int, tp: int) -> dict:
    config = ShardConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp, num_microbatches=2)
    return assert_pipeline_matches(
        lambda: build(num_hidden_layers=4), batch_for("OPTForCausalLM", rows=4), config, zero_grads=ZERO_GRADS
    )


def test_pipeline_trains_like_unsharded():
    """PP=2 x TP=2 on the model's own forward (HFStages): loss and every gradient as unsharded."""
    for report in run_on_ranks(4, _pipeline, 2, 2):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report


def _refused(tp: int) -> str:
    return refusal_message(lambda: build(num_attention_heads=6, hidden_size=48), ShardConfig(tensor_parallel_size=tp))


def test_heads_not_divisible_refused_on_every_rank():
    assert all("num_attention_heads=6 is not divisible" in m for m in run_on_ranks(4, _refused, 4))
