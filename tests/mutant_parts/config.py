"""Mutants of config: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "config-mode-without-sp-accepted",
        "ShardConfig accepts a sequence_parallelism_mode without enable_sequence_parallelism (silently no SP)",
        "shardcore/config.py",
        "ShardConfig.__attrs_post_init__",
        [
            (
                "        if not self.enable_sequence_parallelism and self.sequence_parallelism_mode is not None:",
                "        if False:",
            )
        ],
        "tests/test_core_config.py::test_sequence_parallel_flags_are_checked_in_the_constructor",
        "DID NOT RAISE ValueError",
    ),
]
