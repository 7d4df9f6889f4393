"""Mutants of composite: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "composite-nested-parts-accepted",
        "a composite policy whose parts nest (one inside another) is not refused: the inner part is sharded twice",
        "shardcore/composite.py",
        "CompositePolicy.part_policies",
        [('                    if a != b and b.startswith(f"{a}."):', "                    if False:")],
        "tests/test_core_composite.py::test_parts_must_not_nest",
        "Nor does the model ship a tensor-parallel plan (config.base_model_tp_plan)",
    ),
]
