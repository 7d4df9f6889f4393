"""Mutants of shard-vit: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "vit-region-entry-dropped",
        "ViT's attention not entered into the TP region: q, k, v's input gradient never summed",
        "plugins/shard-vit/shard_vit/hf_policy.py",
        "HFViTPolicy.module_policy",
        [
            (
                '                enter_tp_region=["attention"],\n                per_rank_rng=["attention"],',
                '                per_rank_rng=["attention"],',
            )
        ],
        "plugins/shard-vit/tests/test_vit_hf.py::test_hf_vit_classes[ViTModel-2]",
        "HFViTPolicy: 'attention.q_proj' of ViTLayer is built with copy_input=False",
    ),
    m(
        "timm-region-entry-dropped",
        "timm's attention not entered into the TP region: the fused qkv's input gradient never summed",
        "plugins/shard-vit/shard_vit/timm_policy.py",
        "TimmViTPolicy.module_policy",
        [('                enter_tp_region=["attn"],\n', "")],
        "plugins/shard-vit/tests/test_vit_timm.py::test_timm_models[vit_small_patch16_224-2]",
        "TimmViTPolicy: 'attn.qkv' of Block is built with copy_input=False",
    ),
    m(
        "vit-registers-nothing",
        "shard-vit's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-vit/shard_vit/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-vit/tests/test_vit_hf.py::test_hf_vit_classes[ViTModel-2]",
        "covers transformers.models.vit.modeling_vit.ViTModel",
    ),
]
