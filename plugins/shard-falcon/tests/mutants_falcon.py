"""Mutants of shard-falcon: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "falcon-alibi-mask-whole",
        "shard-falcon: the per-head mask ALiBi was folded into reaches every rank whole, not cut to its heads",
        "plugins/shard-falcon/shard_falcon/policy.py",
        "",
        [('("alibi", "attention_mask"))', '("alibi",))')],
        "plugins/shard-falcon/tests/test_falcon_tp.py::test_matches_unsharded[alibi-tp2]",
        "The size of tensor a (2) must match the size of tensor b (4) at non-singleton dimension 1",
    ),
    m(
        "falcon-registers-nothing",
        "shard-falcon's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-falcon/shard_falcon/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-falcon/tests/test_falcon_tp.py::test_matches_unsharded[alibi-tp2]",
        "covers transformers.models.falcon.modeling_falcon.FalconForCausalLM",
    ),
]
