"""Llama built on the meta device, loaded from a save_pretrained checkpoint, saved back."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import (
    assert_lazy_load_matches,
    assert_resume_matches,
    assert_same_checkpoint,
    run_on_ranks,
    train_and_save,
)

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
    ref = LlamaForCausalLM.from_pretrained(tmp_path / "ckpt")  # the same loader on the original
    with torch.no_grad():
        batch = lm_batch(1001)
        assert torch.equal(reloaded(**batch).logits, ref(**batch).logits)


def _dcp_save(tp: int, path: str) -> None:
    batches = [lm_batch(1001, seed=s) for s in range(2)]
    train_and_save(lambda: build("LlamaForCausalLM", **CFG), batches, ShardConfig(tensor_parallel_size=tp), path)


def _dcp_resume(tp: int, path: str) -> float:
    saved, rest = [lm_batch(1001, seed=s) for s in range(2)], [lm_batch(1001, seed=s) for s in range(2, 4)]
    return assert_resume_matches(
        lambda: build("LlamaForCausalLM", **CFG), saved, rest, ShardConfig(tensor_parallel_size=tp), path
    )


@pytest.mark.parametrize("tp_after", [4, 1])  # TP=4: the 2 KV heads become replicated
def test_distributed_checkpoint_reshards(tp_after, tmp_path):
    run_on_ranks(2, _dcp_save, 2, str(tmp_path / "dcp"))
    run_on_ranks(tp_after, _dcp_resume, tp_after, str(tmp_path / "dcp"))


def _lazy_on_meta_device(ckpt: str) -> str:
    import transformers

    from shardcore import CheckpointError

    batch = lm_batch(1001)
    build_ = lambda: build("LlamaForCausalLM", **CFG)  # noqa: E731
    config = ShardConfig(tensor_parallel_size=2)
    if int(transformers.__version__.split(".")[0]) >= 5:  # _init_weights computes the rotary buffers
        assert_lazy_load_matches(build_, batch, ckpt, config, meta="device")
        return "matches"
    with pytest.raises(CheckpointError) as err:  # 4.x computes them in __init__ only: refused, never garbage
        assert_lazy_load_matches(build_, batch, ckpt, config, meta="device")
    assert "rotary_emb.inv_freq" in str(err.value) and "shardcore.init_empty()" in str(err.value)
    return "refused"


def test_torch_meta_device_build_computes_buffers_or_refuses(tmp_path):
    torch.manual_seed(0)
    build("LlamaForCausalLM", **CFG).save_pretrained(tmp_path / "ckpt")
    results = run_on_ranks(2, _lazy_on_meta_device, str(tmp_path / "ckpt"))
    assert results[0] == results[1]
