"""Mutants of shard-clip: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "clip-region-entry-dropped",
        "CLIP's attentions not entered into the TP region: q, k, v's input gradient never summed",
        "plugins/shard-clip/shard_clip/policy.py",
        "CLIPPolicy.module_policy",
        [("                enter_tp_region=regions,  # q, k, v read one tensor: one backward all-reduce\n", "")],
        "plugins/shard-clip/tests/test_clip_tp.py::test_matches_unsharded[clip-tp2]",
        "CLIPPolicy: 'encoder.layers.0.self_attn.q_proj' of CLIPTextModel is built with copy_input=False",
    ),
    m(
        "clip-registers-nothing",
        "shard-clip's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-clip/shard_clip/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-clip/tests/test_clip_tp.py::test_matches_unsharded[clip-tp2]",
        "covers transformers.models.clip.modeling_clip.CLIPModel",
    ),
]
