"""shard-vit (HF and timm) with the optimization switches, and ``shardcore explain`` against real steps."""

from __future__ import annotations

from vit_cases import hf_batch, hf_build, timm_batch, timm_build, timm_loss

from shardcore import ShardConfig
from shardcore.testing import assert_explain_matches, run_on_ranks

HF_MAIN = "ViTForImageClassification"
TIMM_MAIN = "vit_small_patch16_224"  # 6 heads


def _explain(tp: int, library: str) -> dict:
    config = ShardConfig(tensor_parallel_size=tp)
    if library == "hf":
        return assert_explain_matches(lambda: hf_build(HF_MAIN), hf_batch(HF_MAIN), config)
    return assert_explain_matches(lambda: timm_build(TIMM_MAIN), timm_batch(), config, loss_fn=timm_loss)


def test_explain_predicts_a_step_hf():
    """explain (meta device) predicts a real step's collectives by kind and rank 0's bytes."""
    (report, _) = run_on_ranks(2, _explain, 2, "hf")
    assert report["collectives_per_layer"]["ViTLayer"] == {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}


def test_explain_predicts_a_step_timm():
    (report, _) = run_on_ranks(2, _explain, 2, "timm")
    assert report["collectives_per_layer"]["Block"] == {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}
