"""shard-neox against the unsharded model, on real gloo ranks: a list of cases, each one call of the kit.

Run from shardcore's wheel and this plugin's wheel in a fresh environment (tests/test_core_outside_plugin.py):
nothing here imports a private name of shardcore."""

from __future__ import annotations

import pytest
from neox_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_pipeline_matches,
    assert_sharded_matches,
    hidden_state_loss,
    refusal_message,
    run_on_ranks,
)

#: the query_key_value layout of a plan, split by whole heads with shard-neox's style (loaded by its name)
PLAN = {
    "gpt_neox.embed_in.weight": ["tp", None],
    "gpt_neox.layers.*.attention.query_key_value": "neox_qkv",
    "gpt_neox.layers.*.attention.dense.weight": [None, "tp"],
    "gpt_neox.layers.*.mlp.dense_h_to_4h.weight": ["tp", None],
    "gpt_neox.layers.*.mlp.dense_h_to_4h.bias": ["tp"],
    "gpt_neox.layers.*.mlp.dense_4h_to_h.weight": [None, "tp"],
    "lm_head.weight": ["tp", None],
}

#: id -> (model class, ShardConfig fields, config fields): each an exact comparison with the unsharded model
CASES = {
    "causal-tp2": ("GPTNeoXForCausalLM", {"tensor_parallel_size": 2}, {}),
    "model-tp2": ("GPTNeoXModel", {"tensor_parallel_size": 2}, {}),
    "sequential-residual-tp2": ("GPTNeoXForCausalLM", {"tensor_parallel_size": 2}, {"use_parallel_residual": False}),
    "split-gather-tp2": ("GPTNeoXForCausalLM", {"tensor_parallel_size": 2, "enable_sequence_parallelism": True}, {}),
    "ulysses-sp2": (
        "GPTNeoXForCausalLM",
        {"sequence_parallel_size": 2, "enable_sequence_parallelism": True, "sequence_parallelism_mode": "all_to_all"},
        {},
    ),
    "ring-sp2": (
        "GPTNeoXForCausalLM",
        {"sequence_parallel_size": 2, "enable_sequence_parallelism": True, "sequence_parallelism_mode": "ring_attn"},
        {},
    ),
    "plan-with-the-plugins-style-tp2": ("GPTNeoXForCausalLM", {"tensor_parallel_size": 2, "plan": PLAN}, {}),
}


def _check(case: str) -> dict:  # module level: runs on every rank
    cls_name, fields, cfg = CASES[case]
    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name == "GPTNeoXModel" else {}
    return assert_sharded_matches(lambda: build(cls_name, **cfg), batch_for(cls_name), ShardConfig(**fields), **kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_matches_unsharded(case):
    for report in run_on_ranks(2, _check, case):
        assert "max_abs_diff_after_steps" in report, report


def _pipeline() -> dict:
    config = ShardConfig(pipeline_parallel_size=2, num_microbatches=2)
    return assert_pipeline_matches(lambda: build(num_hidden_layers=4), batch_for(rows=4), config)


def test_pipeline_trains_like_unsharded():
    """PP=2 on the model's own forward (HFStages): loss and every gradient as unsharded."""
    for report in run_on_ranks(2, _pipeline):
        assert "max_abs_diff_after_steps" in report, report


def _too_long() -> str:
    import shardcore

    model = shardcore.optimize(build(), ShardConfig(tensor_parallel_size=2))
    order = [name for name in model.shardcore.attached.describe().splitlines() if ". " in name]
    try:
        model(**batch_for(seq=70))
    except ValueError as err:
        return f"{err} | {order}"
    return "not refused"


def test_the_plugins_own_hook_runs_at_its_declared_place_and_refuses_on_every_rank():
    for message in run_on_ranks(2, _too_long):
        assert "a sequence of 70 tokens is longer than config.max_position_embeddings=64" in message, message
        place = message.split(" | ")[1]
        assert place.index("same_inputs") < place.index("neox_context"), message


def _heads_not_dividing() -> str:
    return refusal_message(lambda: build(num_attention_heads=6, hidden_size=48), ShardConfig(tensor_parallel_size=4))


def test_heads_not_divisible_refused_on_every_rank():
    assert all("num_attention_heads=6 is not divisible" in m for m in run_on_ranks(4, _heads_not_dividing))
