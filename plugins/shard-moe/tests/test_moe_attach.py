"""What optimize attached to an MoE under expert parallelism over DDP: shardcore's hooks listed in run
order, torch's own (DDP's) named beside them, every routed method the one on the model."""

from __future__ import annotations

import pytest
import torch
from moe_cases import build, lm_batch

import shardcore
from shardcore import ShardConfig
from shardcore.testing import assert_attachments_listed, run_on_ranks

pytestmark = pytest.mark.skipif(
    int(__import__("transformers").__version__.split(".")[0]) < 5, reason="transformers 4.x: EP refused by name"
)


def _listed() -> dict:
    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=1, expert_parallel_size=2, data_parallel="ddp", global_batch_balance=True)
    model = shardcore.optimize(build("mixtral"), config)
    batch = lm_batch()
    found = assert_attachments_listed(model, lambda: model(**batch))
    found["text"] = str(model.shardcore)
    return found


def test_an_ep2_moe_over_ddp_lists_its_attachments_beside_torch_s_own():
    for found in run_on_ranks(2, _listed):
        assert found["after"] == ["overflow_agreement", "global_batch_balance", "scope"], found
        assert "generate: ['same_sampling', 'synced_gpus']" in found["routes"], found
        assert "then torch's own: torch.distributed._composable.replicate" in found["text"], found["text"]  # DDP's
