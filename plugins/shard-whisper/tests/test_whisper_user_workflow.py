"""The user's own lines on a sharded Whisper: torch's clip_grad_norm_ and HF's save_pretrained."""

from __future__ import annotations

import pytest
from whisper_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_clipping_matches, assert_save_pretrained_matches, run_on_ranks

CLS = "WhisperForConditionalGeneration"


def _clip(tp: int) -> dict:
    return assert_clipping_matches(lambda: build(CLS), batch_for(CLS), ShardConfig(tensor_parallel_size=tp))


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(
        lambda: build(CLS), batch_for(CLS), ShardConfig(tensor_parallel_size=tp), path
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_clip_grad_norm_is_the_unsharded_norm(tp):
    assert all(r["norm_rel_diff"] <= 1e-5 for r in run_on_ranks(tp, _clip, tp))


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))
