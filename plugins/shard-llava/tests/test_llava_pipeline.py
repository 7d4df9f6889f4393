"""Llava in pipeline stages: the language model's layers cut into stages, the vision tower and the
projector whole on the first stage (the pixels go there only); GPipe at PP=2 and 1F1B at PP=2 x TP=2
equal to the unsharded model on the whole batch (the loss, every held gradient, every parameter after
3 AdamW steps); a forward through the stages with and without an image; generate() and LlavaModel
refused by name."""

from __future__ import annotations

import pytest
import torch
from llava_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_pipeline_matches, run_on_ranks


def _check(tp: int, schedule: str, layers) -> dict:
    config = ShardConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=2,
        num_microbatches=4,
        pipeline_schedule=schedule,
        pipeline_layers=layers,
    )
    return assert_pipeline_matches(
        lambda: build(num_hidden_layers=4), batch_for(rows=4), config, zero_grads=("*.self_attn.k_proj.bias",)
    )


@pytest.mark.parametrize(
    ("tp", "schedule", "layers"),
    [(1, "GPipe", None), (2, "1F1B", [1, 3])],
    ids=["pp2-gpipe", "pp2-tp2-1f1b-1-3"],
)
def test_pipeline_trains_like_unsharded(tp, schedule, layers):
    for report in run_on_ranks(2 * tp, _check, tp, schedule, layers):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report


def _infer() -> dict:
    import shardcore

    torch.manual_seed(0)
    ref = build(num_hidden_layers=4).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build(num_hidden_layers=4), ShardConfig(pipeline_parallel_size=2)).eval()
    out = {}
    for image in (True, False):
        batch = batch_for(rows=2)
        if not image:  # text only: no image tokens, no pixels
            batch = {k: v for k, v in batch.items() if k != "pixel_values"}
            batch["input_ids"] = batch["input_ids"].clamp(max=999)
            batch["labels"] = batch["labels"].clamp(max=999)
        with torch.no_grad():
            got, want = model(**batch), ref(**batch)
        out[image] = max((got.logits - want.logits).abs().max().item(), abs(got.loss - want.loss).item())
    try:
        model.generate(**batch_for(rows=1, labels=False), max_new_tokens=2)
        out["generate"] = "ran"
    except NotImplementedError as err:
        out["generate"] = str(err)
    return out


def test_forward_through_the_stages():
    for out in run_on_ranks(2, _infer):
        assert out[True] <= 1e-5 and out[False] <= 1e-5, out
        assert "computes the image features outside the model's forward" in out["generate"], out


def _refused() -> str:
    from shardcore.testing import refusal_message

    return refusal_message(lambda: build("LlavaModel"), ShardConfig(pipeline_parallel_size=2))


def test_llava_model_without_the_head_refused():
    for message in run_on_ranks(2, _refused):
        assert "lm_head" in message and "LlavaModel" in message, message
