"""Whisper built on the meta device, loaded from a save_pretrained checkpoint, saved back."""

from __future__ import annotations

import pytest
import torch
from whisper_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_lazy_load_matches, assert_same_checkpoint, run_on_ranks

CLS = "WhisperForConditionalGeneration"


def _lazy(config: dict, ckpt: str, out: str) -> float:
    return assert_lazy_load_matches(lambda: build(CLS), batch_for(CLS), ckpt, ShardConfig(**config), save_to=out)


@pytest.mark.parametrize(
    "config",
    [{"tensor_parallel_size": 2}, {"tensor_parallel_size": 4}, {"pipeline_parallel_size": 2}],
    ids=["tp2", "tp4", "pp2"],  # pp2: each stage reads its layers, the writer gets every stage's tensors
)
def test_meta_load_then_save_round_trip(config, tmp_path):
    torch.manual_seed(0)
    build(CLS).save_pretrained(tmp_path / "ckpt")
    world = config.get("tensor_parallel_size", 1) * config.get("pipeline_parallel_size", 1)
    run_on_ranks(world, _lazy, config, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"))
