"""T5 with Megatron sequence parallelism over the encoder's tokens (split_gather, and with the
overlap): outputs, loss, every gradient and 3 AdamW steps equal to the unsharded model at TP=2 and
TP=4; the split really runs (reduce-scatters counted); a padded source; the decoder unsplit;
pipeline stages with it refused by name."""

from __future__ import annotations

import pytest
from t5_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import assert_sharded_matches, hidden_state_loss, refusal_message, run_on_ranks


def _check(tp: int, cls_name: str, family: str, overlap: bool) -> dict:
    config = ShardConfig(tensor_parallel_size=tp, enable_sequence_parallelism=True, enable_sequence_overlap=overlap)
    batch = batch_for(cls_name, rows=2, source=8)
    with count_collectives() as counts:
        extra = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name.endswith("EncoderModel") else {}
        report = assert_sharded_matches(lambda: build(cls_name, family), batch, config, **extra)
    report["reduce_scatters"] = counts.get("reduce_scatter", 0)
    return report


@pytest.mark.parametrize(
    ("tp", "cls_name", "family", "overlap"),
    [
        (2, "T5ForConditionalGeneration", "T5", False),
        (4, "T5ForConditionalGeneration", "T5", True),
        (2, "T5EncoderModel", "UMT5", False),
    ],
    ids=["t5-tp2", "t5-tp4-overlap", "umt5-encoder-tp2"],
)
def test_split_gather_over_the_encoder_matches_unsharded(tp, cls_name, family, overlap):
    for report in run_on_ranks(tp, _check, tp, cls_name, family, overlap):
        assert "max_abs_diff_after_steps" in report, report
        assert report["reduce_scatters"] > 0, report  # the encoder's 8 tokens were split


def _refused() -> str:
    config = ShardConfig(tensor_parallel_size=2, pipeline_parallel_size=2, enable_sequence_parallelism=True)
    return refusal_message(lambda: build(), config)


def test_with_pipeline_stages_refused_before_any_collective():
    for message in run_on_ranks(4, _refused):
        assert "sequence parallelism with pipeline stages is not built for T5" in message, message
