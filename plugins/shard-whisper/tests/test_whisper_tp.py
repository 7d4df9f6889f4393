"""Whisper sharded against the unsharded model: every class, TP=1, 2, 4, and generation."""

from __future__ import annotations

import pytest
import torch
from whisper_cases import batch_for, build, build_for_generation, input_features

import shardcore
from shardcore import ShardConfig
from shardcore.testing import (
    assert_generate_matches,
    assert_sharded_matches,
    hidden_state_loss,
    refusal_message,
    run_on_ranks,
)

CLASSES = ["WhisperModel", "WhisperForConditionalGeneration", "WhisperForAudioClassification", "WhisperEncoder"]
#: parameter bytes per rank over unsharded, measured + 0.02 (the positional embeddings stay whole):
#: one layer left whole (encoder or decoder) goes over it
MAX_FRACTION = {
    2: {"WhisperModel": 0.62, "WhisperForConditionalGeneration": 0.62, "WhisperForAudioClassification": 0.73},
    4: {"WhisperModel": 0.41, "WhisperForConditionalGeneration": 0.41, "WhisperForAudioClassification": 0.59},
}


def _check(tp: int, cls_name: str) -> dict:
    kwargs = (
        {"loss_fn": hidden_state_loss("last_hidden_state", "encoder_last_hidden_state")}
        if cls_name in ("WhisperModel", "WhisperEncoder")
        else {}
    )
    if tp > 1:
        kwargs["max_param_fraction"] = {**MAX_FRACTION[tp], "WhisperEncoder": {2: 0.68, 4: 0.51}[tp]}[cls_name]
    return assert_sharded_matches(
        lambda: build(cls_name), batch_for(cls_name), ShardConfig(tensor_parallel_size=tp), **kwargs
    )


@pytest.mark.parametrize("tp", [2, 4])  # TP=1 returns the model itself: tested once, in the core
@pytest.mark.parametrize("cls_name", CLASSES)
def test_whisper_classes(tp, cls_name):
    run_on_ranks(tp, _check, tp, cls_name)


def _generate(tp: int, num_beams: int) -> list:
    torch.manual_seed(0)
    ref = build_for_generation()
    torch.manual_seed(0)
    model = shardcore.optimize(build_for_generation(), ShardConfig(tensor_parallel_size=tp))
    args = {"max_new_tokens": 20, "num_beams": num_beams, "do_sample": False, "use_cache": True}
    # two tones: their tokens must differ, so an encoder error shows in the tokens
    tokens = assert_generate_matches(ref, model, input_features(), **args)
    assert tokens.shape[1] >= 20, tokens.shape  # really generated 20 tokens (no early stop)
    return tokens.tolist()


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
def test_generate_matches_unsharded(num_beams):
    tokens = run_on_ranks(2, _generate, 2, num_beams)
    assert tokens[0] == tokens[1]


def _error(tp: int) -> str:
    return refusal_message(
        lambda: build("WhisperForConditionalGeneration", heads=6, d_model=48), ShardConfig(tensor_parallel_size=tp)
    )


def test_heads_not_divisible():
    messages = run_on_ranks(4, _error, 4)
    assert all("encoder_attention_heads=6 is not divisible by tensor_parallel_size=4" in m for m in messages), messages


def test_parallel_output_refused():
    with pytest.raises(NotImplementedError, match="parallel_output"):
        shardcore.optimize(build("WhisperForConditionalGeneration"), ShardConfig(parallel_output=True))
