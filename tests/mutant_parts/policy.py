"""Mutants of policy: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "policy-mixed-blocks-accepted",
        "block_type() of a model mixing block classes answers the first class instead of refusing",
        "shardcore/policy.py",
        "block_type",
        [("    if len(types) != 1:", "    if False:")],
        "tests/test_core_config.py::test_block_type_names_mixed_blocks",
        "DID NOT RAISE ValueError",
    ),
]
