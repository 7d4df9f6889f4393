"""Mutants of moved: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "moved-attention-names-unwarned",
        "the attention names moved out of shardcore.kernels resolve silently: plugins get no warning before 0.3 drops them",
        "shardcore/moved.py",
        "moved_names.__getattr__",
        [("        warnings.warn(\n", "        (lambda *a, **k: None)(\n")],
        "tests/test_core_moved_imports.py::test_the_attention_registry_s_old_names_in_kernels_warn_and_are_the_new_code",
        "the moved attention names did not each warn naming their new module",
    ),
    m(
        "renamed-steps-unwarned",
        "0.1's shardcore.steps.optimize resolves to shard silently: callers get no warning before 0.3 drops it",
        "shardcore/moved.py",
        "renamed.__getattr__",
        [("        warnings.warn(", "        (lambda *a, **k: None)(")],
        "tests/test_core_moved_imports.py::test_the_core_steps_old_name_warns_and_is_the_new_function",
        "DID NOT WARN",
        fast=True,
    ),
    m(
        "old-hook-bases-unwarned",
        "0.x's hook bases load from shardcore.plugin_api without the DeprecationWarning naming the spec",
        "shardcore/moved.py",
        "hook_class",
        [("    _warn(", "    (lambda *a, **k: None)(")],
        "tests/test_core_spec.py::test_the_old_hook_bases_warn_from_the_plugin_api",
        "DID NOT WARN",
    ),
    m(
        "stage-attributes-not-read",
        "an HFStages policy written against 0.1 gets the default stages: its class attributes are warned about, not read",
        "shardcore/moved.py",
        "stage_facts_of",
        [("    return facts(**declared)\n", "    return facts()\n")],
        "tests/test_core_moved_imports.py::test_0_1_stage_attributes_warn_naming_the_value_and_are_read_into_it",
        Raised(
            "AssertionError",
            "tests/test_core_moved_imports.py::test_0_1_stage_attributes_warn_naming_the_value_and_are_read_into_it",
        ),
    ),
]
