"""shard-gpt2 with the optimization switches, and ``shardcore explain`` against real steps."""

from __future__ import annotations

import pytest
from gpt2_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_explain_matches,
    assert_switch_matches,
    flash_refused_here,
    run_on_ranks,
    switch_refusal,
)


def _explain(tp: int) -> dict:
    return assert_explain_matches(
        lambda: build("GPT2LMHeadModel"), batch_for("GPT2LMHeadModel"), ShardConfig(tensor_parallel_size=tp)
    )


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind and rank 0's bytes."""
    (report, _) = run_on_ranks(2, _explain, 2)
    assert report["collectives_per_layer"]["GPT2Block"] == {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}
    assert report["collective_bytes_per_step"]["forward"]["all_reduce"] > 0, report["notes"]  # compared by the kit


def _flag(tp: int, flag: str) -> dict:
    return assert_switch_matches(lambda: build("GPT2LMHeadModel"), batch_for("GPT2LMHeadModel"), flag, tp)


def _refused(tp: int) -> str:
    return switch_refusal(lambda: build("GPT2LMHeadModel"), "flash", tp)


@pytest.mark.parametrize("flag", ["flash", "norm", "jit"])
def test_optimization_flags_at_tp2(flag):
    """Each switch on GPT2LMHeadModel at TP=2: outputs, loss, every gradient, three AdamW steps."""
    import transformers

    if flag == "flash" and flash_refused_here(transformers.GPT2LMHeadModel, _refused):
        pytest.skip("flash-attn refused by name here (checked above); the parity check needs CUDA and flash-attn 2")
    (kernels, _) = run_on_ranks(2, _flag, 2, flag)
    key = {"flash": "attention", "norm": "normalization", "jit": "jit_fused"}[flag]
    assert (
        kernels[key]
        == {
            "flash": "shardcore_sdpa",
            "norm": "5 norms on fused kernels",  # 2 per block + final
            "jit": "2 modules compiled (GPT2MLP)",
        }[flag]
    )
