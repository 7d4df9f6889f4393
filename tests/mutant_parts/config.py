"""Mutants of config: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "config-mode-without-sp-accepted",
        "ShardConfig accepts a sequence_parallelism_mode without enable_sequence_parallelism (silently no SP)",
        "shardcore/config_checks.py",
        "check_config",
        [
            (
                "    if not config.enable_sequence_parallelism and config.sequence_parallelism_mode is not None:",
                "    if False:",
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
    m(
        "config-environment-tp-ignored",
        "ShardConfig.from_env ignores SHARDCORE_TP (a launcher's tensor-parallel size silently dropped)",
        "shardcore/config.py",
        "ShardConfig.from_env",
        [('    if env.get("SHARDCORE_TP"):\n', "    if False:\n")],
        "tests/test_core_config.py::test_from_env",
        Raised("AssertionError", "tests/test_core_config.py::test_from_env"),
    ),
]
