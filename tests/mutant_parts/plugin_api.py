"""Mutants of plugin_api: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "plugin-api-old-hooks-silent",
        "0.x's hook bases load from shardcore.plugin_api without the DeprecationWarning naming the spec",
        "shardcore/plugin_api.py",
        "__getattr__",
        [("        warnings.warn(\n", "        (lambda *a, **k: None)(\n")],
        "tests/test_core_spec.py::test_the_old_hook_bases_warn_from_the_plugin_api",
        "DID NOT WARN",
    ),
]
