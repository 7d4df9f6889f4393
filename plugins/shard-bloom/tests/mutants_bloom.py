"""Mutants of shard-bloom: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "bloom-alibi-whole",
        "shard-bloom: ALiBi's bias for every head reaches each rank's attention over its own heads",
        "plugins/shard-bloom/shard_bloom/policy.py",
        "BloomPolicy.module_policy",
        [
            (
                'heads_of_this_rank("self_attention", "query_key_value", ("alibi",))',
                'heads_of_this_rank("self_attention", "query_key_value", ())',
            )
        ],
        "plugins/shard-bloom/tests/test_bloom_tp.py::test_matches_unsharded[causal-tp2]",
        "must match the existing size (8) at non-singleton dimension 0",
    ),
    m(
        "bloom-registers-nothing",
        "shard-bloom's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-bloom/shard_bloom/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-bloom/tests/test_bloom_tp.py::test_matches_unsharded[causal-tp2]",
        "covers transformers.models.bloom.modeling_bloom.BloomForCausalLM",
    ),
]
