"""GPT-2 built on the meta device, loaded from a save_pretrained checkpoint, saved back, resumed."""

from __future__ import annotations

import pytest
import torch
from gpt2_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_lazy_load_matches,
    assert_resume_matches,
    assert_same_checkpoint,
    run_on_ranks,
    train_and_save,
)

CLS = "GPT2LMHeadModel"


def _lazy(tp: int, ckpt: str, out: str) -> float:
    return assert_lazy_load_matches(
        lambda: build(CLS), batch_for(CLS), ckpt, ShardConfig(tensor_parallel_size=tp), save_to=out
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_meta_load_then_save_round_trip(tp, tmp_path):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    build(CLS).save_pretrained(tmp_path / "ckpt")
    run_on_ranks(tp, _lazy, tp, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "out")  # transformers reads it back unsharded
    torch.manual_seed(0)
    ref = build(CLS)
    with torch.no_grad():
        assert torch.equal(reloaded(**batch_for(CLS)).logits, ref(**batch_for(CLS)).logits)


def _save(tp: int, path: str) -> None:
    train_and_save(build, [batch_for(CLS, seed=s) for s in range(2)], ShardConfig(tensor_parallel_size=tp), path)


def _resume(tp: int, path: str) -> float:
    saved = [batch_for(CLS, seed=s) for s in range(2)]
    rest = [batch_for(CLS, seed=s) for s in range(2, 4)]
    return assert_resume_matches(build, saved, rest, ShardConfig(tensor_parallel_size=tp), path)


@pytest.mark.parametrize("tp_after", [4, 1])
def test_distributed_checkpoint_reshards(tp_after, tmp_path):
    run_on_ranks(2, _save, 2, str(tmp_path / "dcp"))
    run_on_ranks(tp_after, _resume, tp_after, str(tmp_path / "dcp"))
