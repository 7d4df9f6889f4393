"""Mutants of the 0.x paths (shardcore.moved): each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "old-layers-path-silent",
        "importing the 0.1 path shardcore.layers no longer warns (a plugin author never hears of the move)",
        "shardcore/moved.py",
        "_OldPaths.create_module",
        [("        _warn(", "        (lambda *a, **k: None)(")],
        "tests/test_core_moved_imports.py::test_the_old_package_warns_naming_the_new_import_and_every_old_module_is_the_new_code",
        "importing shardcore.layers gave the DeprecationWarnings []",
    ),
]
