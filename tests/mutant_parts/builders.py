"""Mutants of builders: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "alibi-first-heads",
        "heads_of_this_rank: every rank adds the first heads' ALiBi slopes (BLOOM), not its own heads'",
        "shardcore/builders.py",
        "heads_of_this_rank.cut",
        [
            (
                "        full, start = local * split.tp_size, local * split.tp_rank\n",
                "        full, start = local * split.tp_size, 0\n",
            )
        ],
        "plugins/shard-bloom/tests/test_bloom_tp.py::test_matches_unsharded[causal-tp2]",
        "output 'logits': max abs diff",
    ),
    m(
        "mlp-inputs-each-copied",
        "an MLP's gate and up projections (one input) each all-reduce their input's gradient",
        "shardcore/builders.py",
        "mlp",
        [('    kw = {"copy_input": not shared_input}', '    kw = {"copy_input": True}')],
        "plugins/shard-llama/tests/test_llama_tp.py::test_collectives_per_step[1-False]",
        "backward collectives {'all_reduce': 5}",
    ),
]
