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
    m(
        "auto-beside-a-layout-unrefused",
        "ShardConfig(auto=True) beside a layout the caller fixed (here a device mesh) is not refused: auto's choice "
        "would silently replace it",
        "shardcore/config_checks.py",
        "check_config",
        [("        if chosen:\n", "        if False:\n")],
        "tests/test_core_given_mesh.py::test_auto_and_a_mesh_are_refused_together",
        "DID NOT RAISE",
    ),
]
