"""GPT-2 in pipeline stages: wte/wpe/dropout on the first stage (the skipped position embedding adds
zero), ln_f and the tied head on the last; equal to the unsharded model, training and generating."""

from __future__ import annotations

import pytest
import torch
from gpt2_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_generate_matches, assert_pipeline_matches, run_on_ranks


def _check(pp: int, tp: int, schedule: str) -> dict:
    config = ShardConfig(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, num_microbatches=4, pipeline_schedule=schedule
    )
    batch = batch_for("GPT2LMHeadModel", batch=4)  # row 0 right-padded: its microbatch holds fewer label tokens
    return assert_pipeline_matches(lambda: build(layers=4), batch, config)


@pytest.mark.parametrize(
    ("pp", "tp", "schedule"), [(2, 1, "GPipe"), (2, 1, "1F1B"), (2, 2, "1F1B"), (2, 1, "ZBVZeroBubble")]
)
def test_pipeline_trains_like_unsharded(pp, tp, schedule):
    for report in run_on_ranks(pp * tp, _check, pp, tp, schedule):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report


def _generate() -> list:
    import shardcore

    torch.manual_seed(0)
    ref = build(layers=4).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build(layers=4), ShardConfig(pipeline_parallel_size=2)).eval()
    ids = torch.randint(1, 1001, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 0, 0  # left padding: position ids from the mask, through the stages
    return assert_generate_matches(
        ref, model, input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0
    ).tolist()


def test_generate_through_the_stages():
    tokens = run_on_ranks(2, _generate)
    assert tokens[0] == tokens[1]
