"""T5, MT5 and UMT5 in pipeline stages: encoder and decoder blocks in one stage list, T5's position
bias handed across stages (UMT5's computed in every block), alone and with TP; pipeline_step equal
to the unsharded model on the whole batch (a padded source, ragged label tokens), a forward through
the stages, generate refused clearly."""

from __future__ import annotations

import pytest
import torch
from t5_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_pipeline_matches, run_on_ranks

CLS = "T5ForConditionalGeneration"


def _before_v5() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) < 5


#: under transformers 4.x T5's stages are refused by name (test_pipeline_refused_by_name_before_v5 checks it)
V4 = "transformers 4.x: T5's pipeline stages are refused by name (test_pipeline_refused_by_name_before_v5)"


def _batch(with_decoder_ids: bool = False) -> dict:
    batch = batch_for(CLS, rows=4)
    for row, ignored in enumerate((0, 3, 5, 1)):  # ragged: a different number of label tokens per microbatch
        batch["labels"][row, 7 - ignored :] = -100
    if with_decoder_ids:  # given, not derived from the labels
        batch["decoder_input_ids"] = torch.randint(2, 1001, (4, 7), generator=torch.Generator().manual_seed(5))
    return batch


def _check(pp: int, tp: int, schedule: str, pipeline_layers, family: str, layers: int, untie: bool) -> dict:
    config = ShardConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        num_microbatches=4,
        pipeline_schedule=schedule,
        pipeline_layers=pipeline_layers,
    )
    shape = {"num_layers": layers, "num_decoder_layers": layers}
    return assert_pipeline_matches(lambda: build(CLS, family, untie=untie, **shape), _batch(), config)


@pytest.mark.parametrize(
    ("pp", "tp", "schedule", "pipeline_layers", "family", "layers", "untie"),
    [
        (2, 1, "GPipe", None, "T5", 2, False),  # encoder | decoder
        (2, 1, "1F1B", [1, 3], "T5", 2, False),  # the encoder's bias handed to its second block's stage
        (2, 2, "1F1B", [3, 1], "T5", 2, False),  # the decoder's bias handed on; the decoder starts on stage 0
        (2, 1, "GPipe", [3, 3], "MT5", 3, True),  # both stacks cut mid-way; an untied head
        (2, 2, "1F1B", [1, 3], "UMT5", 2, False),  # every block its own bias: nothing handed
        (2, 1, "Interleaved1F1B", [1, 1, 1, 1], "T5", 2, False),  # stages entered mid-stack, two per rank
    ],
    ids=["gpipe", "1f1b-1-3", "1f1b-3-1-tp2", "mt5-3-3-untied", "umt5-1-3-tp2", "interleaved"],
)
def test_pipeline_trains_like_unsharded(pp, tp, schedule, pipeline_layers, family, layers, untie):
    if _before_v5():
        pytest.skip(V4)
    for report in run_on_ranks(pp * tp, _check, pp, tp, schedule, pipeline_layers, family, layers, untie):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report


def _infer() -> dict:
    import shardcore

    torch.manual_seed(0)
    ref = build(CLS).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build(CLS), ShardConfig(pipeline_parallel_size=2, pipeline_layers=[1, 3])).eval()
    out = {}
    for given in (False, True):
        batch = _batch(given)
        with torch.no_grad():
            got, want = model(**batch), ref(**batch)
        encoded = (got.encoder_last_hidden_state - want.encoder_last_hidden_state).abs().max().item()
        out[given] = max((got.logits - want.logits).abs().max().item(), abs(got.loss - want.loss).item(), encoded)
    try:
        model.generate(input_ids=batch["input_ids"][:1], max_new_tokens=2)
        out["generate"] = "ran"
    except NotImplementedError as err:
        out["generate"] = str(err)
    return out


def test_forward_through_the_stages():
    if _before_v5():
        pytest.skip(V4)
    for out in run_on_ranks(2, _infer):
        assert out[False] <= 1e-5 and out[True] <= 1e-5, out
        assert "generate() of an encoder-decoder" in out["generate"], out


def _refused(cls_name: str) -> str:
    import shardcore

    try:
        shardcore.optimize(build(cls_name), ShardConfig(pipeline_parallel_size=2))
    except NotImplementedError as err:
        return str(err)
    return "built"


@pytest.mark.parametrize("cls_name", ["T5Model", "T5EncoderModel"])
def test_pipeline_refused_without_the_head(cls_name):
    for message in run_on_ranks(2, _refused, cls_name):
        assert "*ForConditionalGeneration" in message and cls_name in message, message


def test_pipeline_refused_by_name_before_v5():
    if not _before_v5():
        pytest.skip("transformers 5: T5's pipeline stages are built (test_pipeline_trains_like_unsharded)")
    for message in run_on_ranks(2, _refused, CLS):
        assert "pipeline stages are built for transformers >= 5" in message, message
