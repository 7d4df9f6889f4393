"""shard-whisper with the optimization switches, and ``shardcore explain`` against real steps."""

from __future__ import annotations

from whisper_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_explain_matches, run_on_ranks

MAIN = "WhisperForConditionalGeneration"


def _explain(tp: int) -> dict:
    return assert_explain_matches(lambda: build(MAIN), batch_for(MAIN), ShardConfig(tensor_parallel_size=tp))


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind and rank 0's bytes: the
    decoder layer's cross-attention reads the encoder output, so its k/v enter the region apart."""
    (report, _) = run_on_ranks(2, _explain, 2)
    layers = report["collectives_per_layer"]
    assert layers["WhisperEncoderLayer"] == {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}
    assert layers["WhisperDecoderLayer"]["forward"] == {"all_reduce": 3}
