"""The device-strict audit (issue: correct on GPUs by construction): every path a user runs hands
shardcore's collectives tensors on the model's device only. On a GPU an NCCL-only group takes no
CPU tensor; here, with no GPU, a tensor made without a device lands on ``meta`` (the audit's
default device) and any collective handed one is refused by name (``device_strict``). The paths:
the default first forward (with its input check), a training step with torch's clipping, the
forward-only pipeline, ``save_checkpoint``, ``save_pretrained`` and ``generate``."""

from __future__ import annotations

import tempfile

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.checkpoint import save_checkpoint
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import device_strict, run_on_ranks


def _forward(model, batch):
    model(**batch)


def _train(model, batch):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()


def _generate(model, batch):
    model.eval()
    with torch.no_grad():
        model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=3, do_sample=False)


def _pipeline_forward(model, batch):
    model.eval()
    with torch.no_grad():
        model(**batch)


def _save(model, batch, writer):
    with tempfile.TemporaryDirectory() as path:
        writer(model, path)


PATHS = {
    "first-forward": ({}, _forward),
    "training-step": ({}, _train),
    "generate": ({}, _generate),
    "pipeline-forward-only": ({"tensor_parallel_size": 1, "pipeline_parallel_size": 2}, _pipeline_forward),
    "save_checkpoint": ({}, lambda m, b: _save(m, b, save_checkpoint)),
    "save_pretrained": ({}, lambda m, b: _save(m, b, lambda model, path: model.save_pretrained(path))),
}


def _audited(path: str) -> dict:
    import shardcore

    extra, run = PATHS[path]
    torch.manual_seed(0)
    model = build("LlamaForCausalLM", kv=2, layers=2)
    model = shardcore.optimize(model, ShardConfig(**({"tensor_parallel_size": 2} | extra)))
    batch = lm_batch()
    with count_collectives() as issued, device_strict(next(model.parameters()).device):
        run(model, batch)
    return dict(issued)


@pytest.mark.parametrize("path", list(PATHS))
def test_every_collective_gets_a_tensor_on_the_model_s_device(path):
    for issued in run_on_ranks(2, _audited, path):
        assert sum(issued.values()) > 0, issued  # the audited path did hand tensors to collectives
