"""shard-neox against the unsharded model, on real gloo ranks: lists of cases, the kit's suite running them
(shardcore.testing.Family), and the plugin's own hook tested beside them.

Run from shardcore's wheel and this plugin's wheel in a fresh environment (tests/test_core_outside_plugin.py):
nothing here imports a private name of shardcore."""

from __future__ import annotations

from neox_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import Case, Family, Refusal, run_on_ranks

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

NEOX = Family(build, batch_for)
CAUSAL = "GPTNeoXForCausalLM"
ULYSSES = {"sequence_parallel_size": 2, "enable_sequence_parallelism": True, "sequence_parallelism_mode": "all_to_all"}
RING = {**ULYSSES, "sequence_parallelism_mode": "ring_attn"}

test_matches_unsharded = NEOX.matches(
    Case("causal-tp2", CAUSAL),
    Case("model-tp2", "GPTNeoXModel"),
    Case("sequential-residual-tp2", CAUSAL, build={"use_parallel_residual": False}),
    Case("split-gather-tp2", CAUSAL, config={"enable_sequence_parallelism": True}),
    Case("ulysses-sp2", CAUSAL, tp=1, config=ULYSSES),
    Case("ring-sp2", CAUSAL, tp=1, config=RING),
    Case("plan-with-the-plugins-style-tp2", CAUSAL, config={"plan": PLAN}),
)
# PP=2 on the model's own forward (HFStages): loss and every gradient as unsharded
test_pipeline_trains_like_unsharded = NEOX.pipelines(
    Case(
        "pp2",
        CAUSAL,
        tp=1,
        build={"num_hidden_layers": 4},
        batch={"rows": 4},
        config={"pipeline_parallel_size": 2, "num_microbatches": 2},
    )
)
test_heads_not_divisible_refused_on_every_rank = NEOX.refuses(
    Refusal("heads", {"num_attention_heads": 6, "hidden_size": 48}, "num_attention_heads=6 is not divisible")
)


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
