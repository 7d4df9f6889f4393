"""Mutants of inputs: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "block-check-skips-plain-models",
        "the block check finds no input for a model without HF conventions (0.1's probe)",
        "shardcore/inputs.py",
        "find_inputs",
        [
            (
                '        return (hf, "") if hf is not None else _from_signature(model, gen)\n',
                '        return (hf, "") if hf is not None else (None, "it takes neither token ids nor an image")\n',
            )
        ],
        "tests/test_core_own_model.py::test_own_model_with_a_yaml_plan_is_the_unsharded_model[plan-as-written-2]",
        "the block check at optimize did not run (it takes neither token ids nor an image)",
    ),
]
