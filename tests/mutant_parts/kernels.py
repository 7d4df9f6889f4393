"""Mutants of kernels: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "moved-attention-name-dropped",
        "an attention name moved out of shardcore.kernels no longer resolves there: a 0.1 plugin breaks before 0.3",
        "shardcore/kernels.py",
        "",
        [('    "hf_sdpa_name",\n', "")],
        "tests/test_core_moved_imports.py::test_the_attention_registry_s_old_names_in_kernels_warn_and_are_the_new_code",
        "has no attribute 'hf_sdpa_name'",
    ),
]
