"""Distributed checkpoints (torch.distributed.checkpoint) with resharding: save at TP=2, load at
TP=4 and TP=1, keep training: the same numbers as a run that was never interrupted."""

from __future__ import annotations

import pytest
import torch
from toy_models import ToyLM, ToyPolicy, toy_batch

import shardcore
from shardcore import ShardConfig
from shardcore.testing import run_on_ranks

LR, EPS = 1e-3, 1e-5  # eps above the fp32 gradient noise floor, see shardcore.testing


def _model(tp: int):
    torch.manual_seed(0)
    return shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=tp), policy=ToyPolicy)


def _train(model, opt, steps: range) -> None:
    for step in steps:
        loss = model(**toy_batch(seed=step))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()


def _first_half(tp: int, path: str) -> None:
    model = _model(tp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    _train(model, opt, range(2))
    shardcore.save_distributed(model, path, opt)


def _second_half(tp: int, path: str) -> dict:
    model = _model(tp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    shardcore.load_distributed(model, path, opt)
    _train(model, opt, range(2, 4))
    full = {name: t.clone() for name, t in shardcore.full_named_tensors(model)}
    import torch.distributed as dist

    return full if dist.get_rank() == 0 else {}


@pytest.mark.parametrize("tp_after", [4, 1])
def test_save_at_tp2_resume_at_other_tp(tp_after, tmp_path):
    path = str(tmp_path / "dcp")
    run_on_ranks(2, _first_half, 2, path)
    resumed = run_on_ranks(tp_after, _second_half, tp_after, path)[0]

    torch.manual_seed(0)
    ref = ToyLM()
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS)
    _train(ref, opt, range(4))
    for name, param in ref.named_parameters():
        diff = (resumed[name] - param.detach()).abs().max().item()
        assert diff <= 1e-5, (name, diff)
