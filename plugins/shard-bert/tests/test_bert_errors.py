"""Bad input to shard-bert gets the same clear, early error as Llama's."""

from __future__ import annotations

import pytest
from bert_cases import build

import shardcore
from shardcore import ShardConfig
from shardcore.testing import refusal_message, run_on_ranks


def _error(tp: int, cls_name: str, **cfg) -> str:
    return refusal_message(lambda: build(cls_name, **cfg), ShardConfig(tensor_parallel_size=tp))


def test_heads_not_divisible():
    messages = run_on_ranks(4, _error, 4, "BertForMaskedLM", heads=6, hidden=48)
    assert all(
        "BertForMaskedLM: num_attention_heads=6 is not divisible by tensor_parallel_size=4" in m for m in messages
    )


def test_intermediate_not_divisible():
    messages = run_on_ranks(2, _error, 2, "BertModel", intermediate=129)
    assert all("intermediate_size=129 is not divisible by tensor_parallel_size=2" in m for m in messages)


def test_parallel_output_not_supported_yet():
    with pytest.raises(NotImplementedError, match="parallel_output=True"):
        shardcore.optimize(build("BertForMaskedLM"), ShardConfig(parallel_output=True))
