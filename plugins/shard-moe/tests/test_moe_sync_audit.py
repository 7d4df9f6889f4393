"""The sync audit for mixture-of-experts layouts: a steady training step with the backend reported
as NCCL makes no host sync in shardcore's code at TP=2; expert parallelism needs exactly one kind,
listed with its reason (a dropless dispatch must know how many tokens each rank sends)."""

from __future__ import annotations

import pytest
import torch
from moe_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import as_watchdog_backend, record_syncs, run_on_ranks

CONFIGS = {
    "tp2": ({"tensor_parallel_size": 2}, "all_reduce"),
    "ep2": ({"tensor_parallel_size": 1, "expert_parallel_size": 2, "data_parallel": "ddp"}, "all_to_all"),
}
#: the syncs a layout needs, by (kind, file, function), with why
NEEDED = {
    "ep2": {
        ("tolist", "shardcore/expert_parallel.py", "route"): "the all-to-all's split sizes (tokens per rank)",
    },
}


def _fused_experts() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


def _step(model, opt, batch) -> None:
    model(**batch).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()


def _audit(config: str):
    import shardcore

    torch.manual_seed(0)
    model = build("mixtral")
    with as_watchdog_backend():
        model = shardcore.optimize(model, ShardConfig(**CONFIGS[config][0]))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):  # the first steps: the input check, the optimizer's state
            _step(model, opt, lm_batch())
        with record_syncs() as found, count_collectives() as issued:
            _step(model, opt, lm_batch(seed=2))  # steady state: new values, same shapes
    return sorted({(s.kind, s.file, s.site.rsplit("(", 1)[1].rstrip(")")) for s in found}), dict(issued)


@pytest.mark.skipif(not _fused_experts(), reason="transformers 4.x: refused by name (test_moe_tp.py)")
@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_steady_training_step_syncs_only_where_needed(config):
    for found, issued in run_on_ranks(2, _audit, config):
        assert set(found) == set(NEEDED.get(config, {})), found
        assert issued.get(CONFIGS[config][1], 0) > 0, issued  # the layout's collectives ran on the NCCL path
