"""The user's own lines on a sharded ViT: torch's clip_grad_norm_ (HF and timm) and HF's save_pretrained."""

from __future__ import annotations

import pytest
from vit_cases import hf_batch, hf_build, timm_batch, timm_build, timm_loss

from shardcore import ShardConfig
from shardcore.testing import assert_clipping_matches, assert_save_pretrained_matches, run_on_ranks

CLS = "ViTForImageClassification"


def _clip(tp: int) -> dict:
    return assert_clipping_matches(
        lambda: hf_build(CLS),
        hf_batch(CLS),
        ShardConfig(tensor_parallel_size=tp),
        zero_grads=("*.k_proj.bias", "*.key.bias"),  # softmax ignores a shift of every key
    )


def _clip_timm(tp: int) -> dict:
    return assert_clipping_matches(
        lambda: timm_build("vit_tiny_patch16_224", depth=2, num_heads=4),
        timm_batch(),
        ShardConfig(tensor_parallel_size=tp),
        loss_fn=timm_loss,
    )


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(
        lambda: hf_build(CLS), hf_batch(CLS), ShardConfig(tensor_parallel_size=tp), path
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_clip_grad_norm_is_the_unsharded_norm(tp):
    assert all(r["norm_rel_diff"] <= 1e-5 for r in run_on_ranks(tp, _clip, tp))


def test_clip_grad_norm_timm():
    assert all(r["norm_rel_diff"] <= 1e-5 for r in run_on_ranks(2, _clip_timm, 2))


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))
