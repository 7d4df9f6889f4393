"""Mutants of sharded_state: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "full-tensors-not-gathered",
        "full_named_tensors yields each rank's slice of a split parameter, not the whole tensor",
        "shardcore/sharded_state.py",
        "full_named_tensors",
        [
            (
                "            yield name, None if tensor is None else spec.gather(tensor, group)",
                "            yield name, tensor",
            )
        ],
        "tests/test_core_kit_selftest.py::test_kit_passes_the_right_model",
        "gradient of embed.weight (gathered): shape (64, 64) != unsharded (128, 64)",
    ),
]
