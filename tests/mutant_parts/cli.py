"""Mutants of cli: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "cli-plugins-exit-zero-on-a-broken-plugin",
        "`shardcore plugins` exits 0 while a plugin cannot be imported (a CI check of the install passes)",
        "shardcore/cli.py",
        "_plugins",
        [('    failed = 1 if any(r["error"] for r in rows) else 0', "    failed = 0")],
        "tests/test_core_plugins.py::test_cli_table_and_json",
        "shardcore plugins exited 0 with a plugin that cannot be imported",
    ),
]
