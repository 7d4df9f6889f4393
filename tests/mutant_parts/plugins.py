"""Mutants of plugins: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "disabled-plugins-loaded",
        "SHARDCORE_DISABLE_PLUGINS is read but a named plugin is loaded anyway",
        "shardcore/plugins.py",
        "PluginRegistry.load",
        [
            (
                '            if "all" in disabled or ep.name in disabled or ep.name in self.plugins:',
                "            if ep.name in self.plugins:",
            )
        ],
        "tests/test_core_plugins.py::test_disable_plugins_env",
        "SHARDCORE_DISABLE_PLUGINS='other, good' left",
    ),
]
