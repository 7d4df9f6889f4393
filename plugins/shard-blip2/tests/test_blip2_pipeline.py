"""BLIP-2 (an OPT language model) in pipeline stages: the language model's layers cut into stages by
shard-opt's spec, the vision encoder, query tokens, Q-Former and projection whole on the first stage
(the pixels go there only); GPipe at PP=2 and 1F1B at PP=2 x TP=2 equal to the unsharded model on the
whole batch (the loss, every held gradient, every parameter after 3 AdamW steps); a forward through
the stages; generate() and a T5 language model refused by name."""

from __future__ import annotations

import pytest
import torch
from blip2_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_pipeline_matches, run_on_ranks

ZERO = ("*.self_attn.k_proj.bias", "*.attention.key.bias")  # softmax ignores a key bias


def _batch(rows: int = 4) -> dict:
    batch = batch_for(rows=rows)
    batch.pop("use_cache")
    return batch


def _check(tp: int, schedule: str, layers) -> dict:
    config = ShardConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=2,
        num_microbatches=4,
        pipeline_schedule=schedule,
        pipeline_layers=layers,
    )
    return assert_pipeline_matches(lambda: build(num_hidden_layers=4), _batch(), config, zero_grads=ZERO)


@pytest.mark.parametrize(
    ("tp", "schedule", "layers"), [(1, "GPipe", None), (2, "1F1B", [1, 3])], ids=["pp2-gpipe", "pp2-tp2-1f1b-1-3"]
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
    batch = _batch(2)
    with torch.no_grad():
        got, want = model(**batch), ref(**batch)
    out = {"diff": max((got.logits - want.logits).abs().max().item(), abs(got.loss - want.loss).item())}
    try:
        model.generate(**batch_for(rows=1, labels=False), max_new_tokens=2)
        out["generate"] = "ran"
    except NotImplementedError as err:
        out["generate"] = str(err)
    return out


def test_forward_through_the_stages():
    for out in run_on_ranks(2, _infer):
        assert out["diff"] <= 1e-5, out
        assert "BLIP-2's generate() encodes the image outside the model's forward" in out["generate"], out


def _refused() -> str:
    from shardcore.testing import refusal_message

    return refusal_message(lambda: build(language="t5"), ShardConfig(pipeline_parallel_size=2))


def test_an_encoder_decoder_language_model_refused():
    for message in run_on_ranks(2, _refused):
        assert "decoder-only language model" in message, message
