"""shard-vit (HF and timm) with the optimization switches, and ``shardcore explain`` against real steps."""

from __future__ import annotations

import pytest
from vit_cases import hf_batch, hf_build, timm_batch, timm_build, timm_loss

from shardcore import ShardConfig
from shardcore.testing import (
    assert_explain_matches,
    assert_switch_matches,
    flash_refused_here,
    run_on_ranks,
    switch_refusal,
)

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


def _flag(tp: int, library: str, flag: str) -> dict:
    if library == "hf":
        zero = ("*attention.k_proj.bias", "*attention.attention.key.bias")  # softmax ignores a key shift
        return assert_switch_matches(lambda: hf_build(HF_MAIN), hf_batch(HF_MAIN), flag, tp, zero_grads=zero)
    return assert_switch_matches(lambda: timm_build(TIMM_MAIN), timm_batch(), flag, tp, loss_fn=timm_loss)


def _refused(tp: int) -> str:
    return switch_refusal(lambda: hf_build(HF_MAIN), "flash", tp)


@pytest.mark.parametrize("flag", ["flash", "norm", "jit"])
@pytest.mark.parametrize("library", ["hf", "timm"])
def test_optimization_flags_at_tp2(library, flag):
    """Each switch on ViTForImageClassification and timm's ViT at TP=2: outputs, loss, every
    gradient, three AdamW steps equal to the unsharded model running the same kernels. HF ViT
    under transformers 4.x (attention class fixed when built) refuses enable_flash_attention on
    every rank before any collective; its MLP is then two modules (intermediate, output)."""
    import transformers

    if (library, flag) == ("hf", "flash") and flash_refused_here(transformers.ViTForImageClassification, _refused):
        pytest.skip("flash-attn refused by name here (checked above); the parity check needs CUDA and flash-attn 2")
    v5_layout = any(name.endswith(".mlp") for name, _ in hf_build(HF_MAIN).named_modules())
    (kernels, _) = run_on_ranks(2, _flag, 2, library, flag)
    key = {"flash": "attention", "norm": "normalization", "jit": "jit_fused"}[flag]
    assert (
        kernels[key]
        == {
            ("hf", "flash"): "shardcore_sdpa",
            ("timm", "flash"): "sdpa (timm fused_attn)",
            ("hf", "norm"): "5 norms on fused kernels",  # 2 per layer + final
            ("timm", "norm"): "25 norms on fused kernels",  # timm's LayerNorm subclass, 12 blocks
            ("hf", "jit"): "2 modules compiled (ViTMLP)"
            if v5_layout
            else "4 modules compiled (ViTIntermediate, ViTOutput)",
            ("timm", "jit"): "12 modules compiled (Mlp)",
        }[(library, flag)]
    )
