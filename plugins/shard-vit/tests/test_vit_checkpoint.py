"""HF ViT and timm ViT built on the meta device, loaded from checkpoints, saved back."""

from __future__ import annotations

import pytest
import torch
from vit_cases import hf_batch, hf_build, timm_batch, timm_build

from shardcore import ShardConfig
from shardcore.testing import assert_lazy_load_matches, assert_same_checkpoint, run_on_ranks

HF = "ViTForImageClassification"
TIMM = "vit_small_patch16_224"


def _config(tp: int) -> ShardConfig:  # tp=0: two pipeline stages instead
    return ShardConfig(tensor_parallel_size=tp) if tp else ShardConfig(pipeline_parallel_size=2)


def _hf(tp: int, ckpt: str, out: str) -> float:
    return assert_lazy_load_matches(lambda: hf_build(HF), hf_batch(HF), ckpt, _config(tp), save_to=out)


def _timm(tp: int, ckpt: str, out: str) -> float:
    return assert_lazy_load_matches(lambda: timm_build(TIMM, depth=2), timm_batch(), ckpt, _config(tp), save_to=out)


@pytest.mark.parametrize("tp", [2, 4, 0], ids=["tp2", "tp4", "pp2"])
def test_hf_meta_load_then_save_round_trip(tp, tmp_path):
    torch.manual_seed(0)
    hf_build(HF).save_pretrained(tmp_path / "ckpt")
    run_on_ranks(tp or 2, _hf, tp, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"))


@pytest.mark.parametrize("tp", [2, 3, 0], ids=["tp2", "tp3", "pp2"])  # vit_small has 6 heads
def test_timm_meta_load_then_save_round_trip(tp, tmp_path):
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm_build(TIMM, depth=2)
    (tmp_path / "ckpt").mkdir()
    save_file(model.state_dict(), str(tmp_path / "ckpt" / "model.safetensors"))
    run_on_ranks(tp or 2, _timm, tp, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    # timm's own loader reads the written file back
    reloaded = timm.create_model(TIMM, pretrained=False, depth=2, img_size=32, num_classes=10)
    timm.models.load_checkpoint(reloaded, str(tmp_path / "out" / "model.safetensors"), strict=True)
    with torch.no_grad():
        x = timm_batch()["x"]
        assert torch.equal(reloaded(x), model(x))
