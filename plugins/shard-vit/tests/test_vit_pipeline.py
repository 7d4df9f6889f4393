"""HF ViT and timm ViT image classification in pipeline stages, alone and with TP:
pipeline_step equal to the unsharded model on the whole batch; a forward through the stages."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from vit_cases import IMAGE, hf_build, timm_build

from shardcore import ShardConfig
from shardcore.testing import assert_pipeline_matches, run_on_ranks


def _images(seed: int = 1, rows: int = 4) -> torch.Tensor:
    return torch.randn(rows, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(seed))


def _hf_batch() -> dict:
    return {"pixel_values": _images(), "labels": torch.tensor([2, 0, 1, 2])}


def _timm_batch() -> dict:
    return {"x": _images(), "labels": torch.tensor([3, 7, 0, 9])}


def _timm_loss(model, batch) -> torch.Tensor:  # timm takes no labels: cross-entropy as its train.py
    return F.cross_entropy(model(batch["x"]), batch["labels"])


def _config(pp: int, tp: int, schedule: str) -> ShardConfig:
    return ShardConfig(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, num_microbatches=4, pipeline_schedule=schedule
    )


def _check_hf(cls_name: str, pp: int, tp: int, schedule: str) -> dict:
    keys = ("*.k_proj.bias", "*.attention.key.bias")  # zero in exact arithmetic (softmax ignores a shift)
    return assert_pipeline_matches(lambda: hf_build(cls_name), _hf_batch(), _config(pp, tp, schedule), zero_grads=keys)


def _check_timm(pp: int, tp: int, schedule: str, variant: dict) -> dict:
    build = lambda: timm_build("vit_small_patch16_224", depth=2, **variant)  # noqa: E731
    return assert_pipeline_matches(build, _timm_batch(), _config(pp, tp, schedule), reference_loss=_timm_loss)


@pytest.mark.parametrize(
    ("cls_name", "pp", "tp", "schedule"),
    [
        ("ViTForImageClassification", 2, 1, "GPipe"),
        ("ViTForImageClassification", 2, 1, "1F1B"),
        ("DeiTForImageClassification", 2, 2, "1F1B"),
    ],
    ids=["vit-gpipe", "vit-1f1b", "deit-1f1b-tp2"],
)
def test_hf_pipeline_trains_like_unsharded(cls_name, pp, tp, schedule):
    for report in run_on_ranks(pp * tp, _check_hf, cls_name, pp, tp, schedule):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report


@pytest.mark.parametrize(
    ("pp", "tp", "schedule", "variant"),
    [
        (2, 1, "GPipe", {}),
        (2, 1, "1F1B", {"reg_tokens": 2}),
        (2, 2, "1F1B", {"global_pool": "avg", "class_token": False}),
    ],
    ids=["gpipe", "1f1b-registers", "1f1b-tp2-avg-pool"],
)
def test_timm_pipeline_trains_like_unsharded(pp, tp, schedule, variant):
    for report in run_on_ranks(pp * tp, _check_timm, pp, tp, schedule, variant):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report


def _infer(family: str) -> dict:
    import shardcore

    def build():
        torch.manual_seed(0)
        return (
            hf_build("ViTForImageClassification") if family == "hf" else timm_build("vit_small_patch16_224", depth=2)
        ).eval()

    ref, model = build(), shardcore.optimize(build(), ShardConfig(pipeline_parallel_size=2))
    with torch.no_grad():
        if family == "hf":
            batch = _hf_batch()
            got, want = model(**batch), ref(**batch)
            return {"logits": (got.logits - want.logits).abs().max().item(), "loss": abs(got.loss - want.loss).item()}
        x = _images()
        return {"logits": (model(x) - ref(x)).abs().max().item(), "loss": 0.0}


@pytest.mark.parametrize("family", ["hf", "timm"])
def test_forward_through_the_stages(family):
    for out in run_on_ranks(2, _infer, family):
        assert out["logits"] <= 1e-5 and out["loss"] <= 1e-6, out
