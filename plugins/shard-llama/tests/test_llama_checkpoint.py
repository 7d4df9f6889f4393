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


LR, EPS = 1e-3, 1e-5  # eps above the fp32 gradient noise floor, see shardcore.testing


def _dcp_model(tp: int):
    import shardcore

    torch.manual_seed(0)
    return shardcore.optimize(build("LlamaForCausalLM", **CFG), ShardConfig(tensor_parallel_size=tp))


def _dcp_train(model, opt, steps) -> None:
    for step in steps:
        loss = model(**lm_batch(1001, seed=step)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


def _dcp_save(tp: int, path: str) -> None:
    import shardcore

    model = _dcp_model(tp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    _dcp_train(model, opt, range(2))
    shardcore.save_distributed(model, path, opt)


def _dcp_resume(tp: int, path: str) -> dict:
    import torch.distributed as dist

    import shardcore

    model = _dcp_model(tp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    shardcore.load_distributed(model, path, opt)
    _dcp_train(model, opt, range(2, 4))
    full = {name: t.clone() for name, t in shardcore.full_named_tensors(model)}
    return full if dist.get_rank() == 0 else {}


@pytest.mark.parametrize("tp_after", [4, 1])  # TP=4: the 2 KV heads become replicated
def test_distributed_checkpoint_reshards(tp_after, tmp_path):
    run_on_ranks(2, _dcp_save, 2, str(tmp_path / "dcp"))
    resumed = run_on_ranks(tp_after, _dcp_resume, tp_after, str(tmp_path / "dcp"))[0]
    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", **CFG)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS)
    _dcp_train(ref, opt, range(4))
    for name, param in ref.named_parameters():
        diff = (resumed[name] - param.detach()).abs().max().item()
        assert diff <= 1e-5, (name, diff)
