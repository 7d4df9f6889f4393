"""Mutants of sharder: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "tied-weight-untied",
        "a tied weight left untied after sharding (the sharder's retie skipped)",
        "shardcore/sharder.py",
        "ModelSharder._retie",
        [("        for places in shared:\n", "        for places in shared[:0]:\n")],
        "plugins/shard-llama/tests/test_llama_tp.py::test_causal_lm_variants[tied-2]",
        "parameters differ",
    ),
    m(
        "composite-glue-reaches-into-parts",
        "a composite policy's own descriptions also matched inside its parts (a part's blocks replaced twice)",
        "shardcore/sharder.py",
        "ModelSharder.plan",
        [
            (
                '            if any(name == path or name.startswith(f"{path}.") for path in parts):\n                continue\n',
                '            if any(name == path or name.startswith(f"{path}.") for path in parts):\n                pass\n',
            )
        ],
        "tests/test_core_composite.py::test_each_part_is_sharded_by_the_policy_the_registry_finds[2]",
        "expected size 128 along dim 0, got shape (64, 64)",
    ),
]
