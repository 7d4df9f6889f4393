"""Mutants of shard-sam: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "sam-rel-pos-gradient-partial",
        "shard-sam: the relative-position tables' gradient left at this rank's heads' share (not summed)",
        "plugins/shard-sam/shard_sam/policy.py",
        "SamPolicy.tensor_parallel",
        [
            (
                "        return TensorParallelSpec(grad_sum=[n for n, _ in self.model.named_parameters() if n.endswith(tables)])",
                "        return TensorParallelSpec()",
            )
        ],
        "plugins/shard-sam/tests/test_sam_tp.py::test_matches_unsharded[rel-pos-tp2]",
        "gradient of vision_encoder.layers.0.attn.rel_pos_h",
    ),
    m(
        "sam-registers-nothing",
        "shard-sam's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-sam/shard_sam/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-sam/tests/test_sam_tp.py::test_matches_unsharded[rel-pos-tp2]",
        "covers transformers.models.sam.modeling_sam.SamModel",
    ),
]
