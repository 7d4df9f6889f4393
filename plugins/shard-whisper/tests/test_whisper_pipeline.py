"""WhisperForConditionalGeneration in pipeline stages: encoder and decoder layers in one stage
list, alone and with TP; pipeline_step equal to the unsharded model on the whole batch (ragged
label tokens), a forward through the stages, generate refused clearly."""

from __future__ import annotations

import pytest
import torch
from whisper_cases import VOCAB, build, input_features

from shardcore import ShardConfig
from shardcore.testing import assert_pipeline_matches, run_on_ranks

CLS = "WhisperForConditionalGeneration"


def _batch(with_decoder_ids: bool = False) -> dict:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(4, VOCAB, (4, 8), generator=g)
    for row, ignored in enumerate((0, 3, 5, 1)):  # ragged: a different number of label tokens per microbatch
        if ignored:
            labels[row, -ignored:] = -100
    out = {"input_features": input_features(4), "labels": labels}
    if with_decoder_ids:  # given, not derived from the labels
        out["decoder_input_ids"] = torch.randint(4, VOCAB, (4, 8), generator=g)
    return out


def _check(pp: int, tp: int, schedule: str, pipeline_layers) -> dict:
    config = ShardConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        num_microbatches=4,
        pipeline_schedule=schedule,
        pipeline_layers=pipeline_layers,
    )
    return assert_pipeline_matches(lambda: build(CLS), _batch(), config, zero_grads=("*.k_proj.bias",))


@pytest.mark.parametrize(
    ("pp", "tp", "schedule", "pipeline_layers"),
    [  # two encoder and two decoder layers
        (2, 1, "GPipe", None),  # encoder | decoder
        (2, 1, "1F1B", [1, 3]),  # encoder layer 1 and the decoder on one stage
        (2, 2, "1F1B", [3, 1]),  # the decoder's embeddings and first layer with the encoder's end
        (2, 1, "Interleaved1F1B", [1, 1, 1, 1]),  # an encoder stage entered mid-way; tied weights on two ranks
    ],
    ids=["gpipe", "1f1b-1-3", "1f1b-3-1-tp2", "interleaved"],
)
def test_pipeline_trains_like_unsharded(pp, tp, schedule, pipeline_layers):
    for report in run_on_ranks(pp * tp, _check, pp, tp, schedule, pipeline_layers):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report


def _infer() -> dict:
    import shardcore

    torch.manual_seed(0)
    ref = build(CLS).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build(CLS), ShardConfig(pipeline_parallel_size=2)).eval()
    out = {}
    for given in (False, True):
        batch = _batch(given)
        with torch.no_grad():
            got, want = model(**batch), ref(**batch)
        encoded = (got.encoder_last_hidden_state - want.encoder_last_hidden_state).abs().max().item()
        out[given] = max((got.logits - want.logits).abs().max().item(), abs(got.loss - want.loss).item(), encoded)
    try:
        model.generate(input_features=batch["input_features"][:1], max_new_tokens=2)
        out["generate"] = "ran"
    except NotImplementedError as err:
        out["generate"] = str(err)
    return out


def test_forward_through_the_stages():
    for out in run_on_ranks(2, _infer):
        assert out[False] <= 1e-5 and out[True] <= 1e-5, out
        assert "generate() of an encoder-decoder" in out["generate"], out
