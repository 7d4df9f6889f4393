"""Sharded Llava against the unsharded model: its CLIP tower by shard-clip, its Llama by shard-llama."""

from __future__ import annotations

import pytest
import torch
from llava_cases import batch_for, build

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

#: zero in exact arithmetic: a key bias adds the same q.b to every score of a query, which softmax ignores
ZERO_GRADS = ("*.self_attn.k_proj.bias",)


def _check(tp: int, cls_name: str) -> dict:  # module level: runs on every rank
    import shardcore

    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name == "LlavaModel" else {}
    report = assert_sharded_matches(
        lambda: build(cls_name),
        batch_for(cls_name),
        ShardConfig(tensor_parallel_size=tp),
        zero_grads=ZERO_GRADS,
        max_param_fraction=0.6 if tp == 2 else None,
        **kwargs,
    )
    torch.manual_seed(0)
    model = shardcore.optimize(build(cls_name), ShardConfig(tensor_parallel_size=tp))
    parts = {path: type(policy).__name__ for path, policy in model.shardcore.policy.part_policies().items()}
    return {**report, "parts": parts}


@pytest.mark.parametrize("tp", [2, 4])  # 2 key/value heads: split at TP=2, replicated at TP=4
def test_matches_unsharded(tp):
    for report in run_on_ranks(tp, _check, tp, "LlavaForConditionalGeneration"):
        assert "max_abs_diff_after_steps" in report, report
        want = {"model.vision_tower": "CLIPPolicy", "model.language_model": "LlamaModelPolicy"}
        assert report["parts"] == want, f"the parts sharded: {report['parts']}, not {want}"


def test_llava_model_matches_unsharded():
    for report in run_on_ranks(2, _check, 2, "LlavaModel"):
        assert report["parts"] == {"vision_tower": "CLIPPolicy", "language_model": "LlamaModelPolicy"}


def _generate(tp: int):
    import shardcore

    torch.manual_seed(0)
    ref = build(initializer_range=0.5).eval()  # larger weights: tokens that vary, so the check can fail
    torch.manual_seed(0)
    model = shardcore.optimize(build(initializer_range=0.5), ShardConfig(tensor_parallel_size=tp)).eval()
    kwargs = {"max_new_tokens": 8, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    return assert_generate_matches(ref, model, **batch_for(labels=False), **kwargs).tolist()


def test_generate_matches_unsharded():
    tokens = run_on_ranks(2, _generate, 2)
    assert tokens[0] == tokens[1]


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(build, batch_for(), ShardConfig(tensor_parallel_size=tp), path)


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))


def _refused(tp: int) -> str:
    return refusal_message(
        lambda: build(num_attention_heads=2, num_key_value_heads=2), ShardConfig(tensor_parallel_size=tp)
    )


def test_a_part_s_refusal_names_the_part_on_every_rank():
    for message in run_on_ranks(4, _refused, 4):
        assert "LlavaForConditionalGeneration.model.language_model (LlamaModelPolicy)" in message, message
        assert "num_attention_heads=2 is not divisible" in message, message


def _explain(tp: int) -> dict:
    # the vision tower runs on patches, the Llama on tokens: explain's bytes (priced at the ids' length) left out
    return assert_explain_matches(build, batch_for(), ShardConfig(tensor_parallel_size=tp), price_bytes=False)


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind, each part's, and rank 0's bytes."""
    report = run_on_ranks(2, _explain, 2)[0]
    layers = report["collectives_per_layer"]
    assert layers["CLIPEncoderLayer"]["forward"] == layers["LlamaDecoderLayer"]["forward"] == {"all_reduce": 2}, layers
