"""Mutants of shard-glm: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "glm-gate-up-split-as-one",
        "shard-glm: the fused [gate; up] split as one block (rank 0 all gate, rank 1 all up), not half by half",
        "plugins/shard-glm/shard_glm/policy.py",
        "GlmPolicy.module_policy",
        [('kwargs={"heads": (width, width), "head_dim": 1}', 'kwargs={"heads": (2 * width,), "head_dim": 1}')],
        "plugins/shard-glm/tests/test_glm_tp.py::test_matches_unsharded[glm-tp2]",
        "output 'logits': max abs diff",
    ),
    m(
        "glm-registers-nothing",
        "shard-glm's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-glm/shard_glm/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "tests/test_core_plugins.py::test_each_bundled_plugin_covers_its_models[glm]",
        "shard-glm's hook left",
        fast=True,
    ),
]
