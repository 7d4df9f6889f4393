"""Whisper built on the meta device, loaded from a save_pretrained checkpoint, saved back."""

from __future__ import annotations

import pytest
import torch
from whisper_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_lazy_load_matches, assert_same_checkpoint, run_on_ranks

CLS = "WhisperForConditionalGeneration"


def _lazy(tp: int, ckpt: str, out: str) -> float:
    return assert_lazy_load_matches(
        lambda: build(CLS), batch_for(CLS), ckpt, ShardConfig(tensor_parallel_size=tp), save_to=out
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_meta_load_then_save_round_trip(tp, tmp_path):
    torch.manual_seed(0)
    build(CLS).save_pretrained(tmp_path / "ckpt")
    run_on_ranks(tp, _lazy, tp, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"))
