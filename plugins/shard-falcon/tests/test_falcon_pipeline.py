"""Falcon (multi-query) in pipeline stages on the model's own forward (rotary built on each stage): GPipe at PP=2 and 1F1B at
PP=2 x TP=2, training equal to the unsharded model on the whole batch (the loss, every held gradient,
every parameter after 3 AdamW steps); greedy generate() through the stages equal to the unsharded model
(tokens and scores)."""

from __future__ import annotations

import pytest
from falcon_cases import VOCAB, build

from shardcore import ShardConfig
from shardcore.testing import assert_pipeline_matches, run_on_ranks, token_batch


def _check(tp: int, schedule: str) -> dict:
    config = ShardConfig(
        tensor_parallel_size=tp, pipeline_parallel_size=2, num_microbatches=4, pipeline_schedule=schedule
    )
    # row 0 left-padded: its microbatch holds fewer label tokens than the others
    return assert_pipeline_matches(lambda: build(num_hidden_layers=4), token_batch(VOCAB, 4), config)


@pytest.mark.parametrize(("tp", "schedule"), [(1, "GPipe"), (2, "1F1B")], ids=["pp2-gpipe", "pp2-tp2-1f1b"])
def test_pipeline_trains_like_unsharded(tp, schedule):
    for report in run_on_ranks(2 * tp, _check, tp, schedule):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report


def _generate() -> list:
    import torch

    from shardcore.testing import assert_generate_through_stages

    def make():  # weights wide enough that greedy tokens vary (the kit refuses an input that cannot fail)
        torch.manual_seed(0)
        return build("FalconForCausalLM", num_hidden_layers=4, initializer_range=0.5)

    return assert_generate_through_stages(make, VOCAB)


def test_generate_through_the_stages():
    tokens = run_on_ranks(2, _generate)
    assert tokens[0] == tokens[1]
