"""Mutants of shard-diffusers: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "dit-heads-not-per-rank",
        "shard-diffusers leaves each attention's head count whole: the processor reshapes a rank's slice into every head",
        "plugins/shard-diffusers/shard_diffusers/policy.py",
        "DiTPolicy.module_policy",
        [('                attribute_replacement={f"{a}.heads": heads // tp for a in attentions},\n', "")],
        "plugins/shard-diffusers/tests/test_diffusers_tp.py::test_matches_unsharded[DiTTransformer2DModel-2]",
        "output 'sample': max abs diff",
    ),
    m(
        "diffusers-registers-nothing",
        "shard-diffusers's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-diffusers/shard_diffusers/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-diffusers/tests/test_diffusers_tp.py::test_matches_unsharded[DiTTransformer2DModel-2]",
        "covers diffusers.models.transformers.dit_transformer_2d.DiTTransformer2DModel",
    ),
]
