"""The user's own lines on a sharded mixture-of-experts model: clip_grad_norm_, save_pretrained /
from_pretrained, greedy generate with a KV cache, explain's counts against a real step; and the
checkpoint layout shard-on-read does not read yet, refused by name."""

from __future__ import annotations

import pytest
import torch
from moe_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import (
    assert_clipping_matches,
    assert_explain_matches,
    assert_generate_matches,
    assert_save_pretrained_matches,
    run_on_ranks,
)

TP2 = ShardConfig(tensor_parallel_size=2)


def _fused_experts() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


pytestmark = pytest.mark.skipif(
    not _fused_experts(),
    reason="transformers 4.x: refused by name (test_moe_tp.py::test_transformers_4_refused_by_name)",
)


def _clip(family: str) -> dict:
    return assert_clipping_matches(lambda: build(family), lm_batch(), TP2)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_clip_grad_norm_matches_unsharded(family):
    for report in run_on_ranks(2, _clip, family):
        assert report, report


def _saved(path: str) -> dict:
    return assert_save_pretrained_matches(lambda: build("qwen3_moe", kv=1), lm_batch(), TP2, path)


def test_save_pretrained_then_from_pretrained(tmp_path):
    run_on_ranks(2, _saved, str(tmp_path / "saved"))


def _load(ckpt: str) -> str:
    import shardcore

    with shardcore.init_empty():
        model = build("mixtral")
    model = shardcore.optimize(model, TP2)
    with pytest.raises(shardcore.CheckpointError) as err:
        shardcore.load_checkpoint(model, ckpt)
    return str(err.value)


def test_checkpoint_in_per_expert_layout_refused_by_name(tmp_path):
    """transformers 5 writes Mixtral's experts one tensor each (``block_sparse_moe.experts.0.w1``) and
    fuses them when loading; shardcore's shard-on-read loader reads tensors by the model's names and
    does not fuse yet: it refuses, naming the fused tensors it did not find (never a half-loaded model)."""
    torch.manual_seed(0)
    build("mixtral").save_pretrained(tmp_path / "ckpt")
    for message in run_on_ranks(2, _load, str(tmp_path / "ckpt")):
        assert "missing tensor 'model.layers.0.mlp.experts.gate_up_proj'" in message, message


def _generate() -> list:
    import shardcore

    torch.manual_seed(0)
    ref = build("mixtral", output_router_logits=False).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build("mixtral", output_router_logits=False), TP2).eval()
    prompt = lm_batch(pad=True)
    del prompt["labels"]
    kwargs = {"max_new_tokens": 8, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    return assert_generate_matches(ref, model, **prompt, **kwargs).tolist()


def test_generate_matches_unsharded():
    tokens = run_on_ranks(2, _generate)
    assert tokens[0] == tokens[1]


def _explain() -> dict:
    return assert_explain_matches(lambda: build("qwen2_moe"), lm_batch(), TP2)


def test_explain_predicts_a_step():
    """explain's counts (the experts' all-reduce forward, two backward) match a real step, and
    rank 0's bytes are what it holds: half the experts."""
    report = run_on_ranks(2, _explain)[0]
    rows = {r["pattern"]: r for r in report["modules"]}
    experts = rows["model.layers.*.mlp.experts"]
    assert experts["collectives"] == {"forward": ["all_reduce"], "backward": ["all_reduce", "all_reduce"]}
    assert experts["bytes_per_rank"] == 2 * 2 * (2 * 48 * 64 + 64 * 48) * 4  # 2 layers x 2 of 4 experts, fp32
