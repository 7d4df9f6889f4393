"""Mutants of shard-blip2: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "blip2-vision-mlp-left-whole",
        "BLIP-2's vision encoder policy replaces no MLP: its blocks stay whole on every rank",
        "plugins/shard-blip2/shard_blip2/policy.py",
        "Blip2VisionPolicy.module_policy",
        [
            (
                'ModulePolicyDescription(sub_module_replacement=mlp("mlp"))}',
                "ModulePolicyDescription(sub_module_replacement=[])}",
            )
        ],
        "plugins/shard-blip2/tests/test_blip2_tp.py::test_matches_unsharded[opt-tp2]",
        "blocks ['vision_model.encoder.layers.0', 'vision_model.encoder.layers.1'] hold no parallel module",
    ),
    m(
        "blip2-registers-nothing",
        "shard-blip2's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-blip2/shard_blip2/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-blip2/tests/test_blip2_tp.py::test_matches_unsharded[opt-tp2]",
        "covers transformers.models.blip_2.modeling_blip_2.Blip2ForConditionalGeneration",
    ),
    m(
        "blip2-stage-image-blanked",
        "shard-blip2's first stage encodes a blank image, not the batch's pixels",
        "plugins/shard-blip2/shard_blip2/policy.py",
        "Blip2Policy._pp_stage_forward",
        [
            (
                "        out = self.model(input_ids=ids, pixel_values=pixels, **kwargs)",
                "        out = self.model(input_ids=ids, pixel_values=pixels * 0, **kwargs)",
            )
        ],
        "plugins/shard-blip2/tests/test_blip2_pipeline.py::test_pipeline_trains_like_unsharded[pp2-gpipe]",
        "pipeline_step loss",
    ),
]
