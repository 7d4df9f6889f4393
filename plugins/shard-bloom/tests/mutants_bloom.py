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
    m(
        "bloom-pipeline-stage-split-wrong",
        "shard-bloom declares pipeline stages whose first stage does not own the embedding's layer norm: every "
        "stage normalizes its input again",
        "plugins/shard-bloom/shard_bloom/policy.py",
        "BloomPolicy.stages",
        [
            (
                'first_ends=("word_embeddings", "word_embeddings_layernorm"),',
                'first_ends=("word_embeddings",),',
            )
        ],
        "tests/test_core_matrix.py::test_a_cell_measures_as_declared[bloom-pp]",
        "bloom pp: declared, measured wrong",
    ),
]
