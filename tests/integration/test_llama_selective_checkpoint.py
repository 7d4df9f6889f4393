"""Selective activation checkpointing (shardcore.selective_checkpoint_context through the model's own
gradient_checkpointing_enable) on a sharded Llama: at TP=2, and at TP=2 with split_gather, the outputs,
loss, every gradient and 3 AdamW steps equal the unsharded model's; the policy ran on the sharded
blocks' ops, keeping the matmuls' outputs and recomputing the rest."""

from __future__ import annotations

import pytest
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, run_on_ranks


def _check(sequence: bool) -> dict:
    import shardcore

    decided = {"save": 0, "recompute": 0}  # the policy's decisions, counted by the context
    context = shardcore.selective_checkpoint_context(counts=decided)

    def checkpointed():
        model = build("LlamaForCausalLM")
        # --8<-- [start:enable]
        kwargs = {
            "use_reentrant": False,
            "context_fn": context,
        }  # context = shardcore.selective_checkpoint_context()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        # --8<-- [end:enable]
        return model

    config = ShardConfig(tensor_parallel_size=2, enable_sequence_parallelism=sequence)
    report = assert_sharded_matches(checkpointed, lm_batch(seq=12), config)
    return report | decided


@pytest.mark.parametrize("sequence", [False, True], ids=["tp2", "tp2-split_gather"])
def test_selective_checkpointing_matches_unsharded(sequence):
    for report in run_on_ranks(2, _check, sequence):
        assert "max_abs_diff_after_steps" in report, report
        assert report["save"] > 0 and report["recompute"] > report["save"], report


def test_an_unknown_op_group_is_refused():
    import shardcore

    with pytest.raises(ValueError, match=r"unknown \['norms'\]; choose from \['attention', 'matmul'\]"):
        shardcore.selective_checkpoint_context(("matmul", "norms"))
