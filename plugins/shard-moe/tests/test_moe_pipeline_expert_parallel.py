"""Mixtral in pipeline stages with expert parallelism: PP=2 x EP=2 (the experts of each stage's layers
over its two data-parallel ranks, DDP for the rest), and PP=2 x EP=2 x TP=2 on 8 ranks (slow):
pipeline_step trains like the unsharded model on the whole batch (the loss, every gradient, every
parameter after 3 AdamW steps); the experts' all-to-alls really run."""

from __future__ import annotations

import pytest
from moe_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import assert_pipeline_matches, run_on_ranks


def _fused_experts() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


pytestmark = pytest.mark.skipif(
    not _fused_experts(),
    reason="transformers 4.x: refused by name (test_moe_tp.py::test_transformers_4_refused_by_name)",
)


def _check(tp: int, schedule: str) -> dict:
    from shardcore.tensor_parallel import count_collectives

    config = ShardConfig(
        pipeline_parallel_size=2,
        data_parallel_size=2,
        expert_parallel_size=2,
        tensor_parallel_size=tp,
        data_parallel="ddp",
        num_microbatches=2,
        pipeline_schedule=schedule,
    )
    with count_collectives() as counts:  # no padding: each data-parallel part holds as many label tokens
        report = assert_pipeline_matches(
            lambda: build("mixtral", num_hidden_layers=4, output_router_logits=False),
            lm_batch(batch=4, pad=False),
            config,
        )
    report["all_to_all"] = counts.get("all_to_all", 0) + counts.get("all_to_all_v", 0)
    return report


@pytest.mark.parametrize(
    ("tp", "schedule"),
    [(1, "1F1B"), pytest.param(2, "GPipe", marks=pytest.mark.slow)],
    ids=["pp2-ep2-1f1b", "pp2-ep2-tp2-gpipe"],
)
def test_pipeline_with_expert_parallelism_trains_like_unsharded(tp, schedule):
    for report in run_on_ranks(4 * tp, _check, tp, schedule):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report
        assert report["all_to_all"] > 0, report
