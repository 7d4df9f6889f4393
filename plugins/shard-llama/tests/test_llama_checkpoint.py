"""Llama built on the meta device, loaded from a save_pretrained checkpoint, saved back."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import assert_lazy_load_matches, assert_same_checkpoint, run_on_ranks

CFG = {"kv": 2, "vocab": 1001, "tie": True}  # replicated KV heads at TP=4, padded vocab, tied embeddings


def _lazy(tp: int, ckpt: str, out: str) -> float:
    batch = lm_batch(1001)
    return assert_lazy_load_matches(
        lambda: build("LlamaForCausalLM", **CFG), batch, ckpt, ShardConfig(tensor_parallel_size=tp), save_to=out
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_meta_load_then_save_round_trip(tp, tmp_path):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    build("LlamaForCausalLM", **CFG).save_pretrained(tmp_path / "ckpt")
    run_on_ranks(tp, _lazy, tp, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "out")  # HF reads it back unsharded
    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", **CFG)
    with torch.no_grad():
        batch = lm_batch(1001)
        assert torch.equal(reloaded(**batch).logits, ref(**batch).logits)
