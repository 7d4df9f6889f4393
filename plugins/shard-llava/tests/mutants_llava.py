"""Mutants of shard-llava: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "llava-vision-tower-not-a-part",
        "LLaVA's composite policy names the language model alone: the vision tower is not sharded",
        "plugins/shard-llava/shard_llava/policy.py",
        "LlavaPolicy.parts",
        [
            (
                "        return [self._path(base.vision_tower), self._path(base.language_model)]",
                "        return [self._path(base.language_model)]",
            )
        ],
        "plugins/shard-llava/tests/test_llava_tp.py::test_matches_unsharded[2]",
        "the parts sharded: {'model.language_model': 'LlamaModelPolicy'}",
    ),
    m(
        "llava-registers-nothing",
        "shard-llava's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-llava/shard_llava/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-llava/tests/test_llava_tp.py::test_matches_unsharded[2]",
        "'PlanPolicy' object has no attribute 'part_policies'",
    ),
]
