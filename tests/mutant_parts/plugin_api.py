"""Mutants of plugin_api: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "plugin-api-old-hooks-silent",
        "0.x's hook bases no longer load from shardcore.plugin_api: a 0.1 plugin breaks before 0.3",
        "shardcore/plugin_api.py",
        "__getattr__",
        [('    if name in ("PipelineHooks", "SequenceHooks"):', "    if False:")],
        "tests/test_core_spec.py::test_a_0x_policy_on_the_old_hook_bases_still_loads_and_declares_nothing_it_did_not",
        Raised("AttributeError", "shardcore/plugin_api.py::__getattr__"),
    ),
]
