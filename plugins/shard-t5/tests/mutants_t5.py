"""Mutants of shard-t5: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "t5-shared-embedding-apart",
        "shard-t5: the shared embedding left a module of its own, which the forward never calls",
        "plugins/shard-t5/shard_t5/policy.py",
        "T5Policy.postprocess",
        [("                self.model.shared = encoder\n", "                pass\n")],
        "plugins/shard-t5/tests/test_t5_tp.py::test_explain_predicts_a_step",
        "bytes per step, this rank put",
    ),
    m(
        "t5-registers-nothing",
        "shard-t5's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-t5/shard_t5/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-t5/tests/test_t5_tp.py::test_matches_unsharded[t5-tp2]",
        "covers transformers.models.t5.modeling_t5.T5ForConditionalGeneration",
    ),
    m(
        "t5-pipeline-bias-not-handed",
        "shard-t5: a stage entered mid-stack leaves the position bias the stage before handed it, so its "
        "first block attends with a zero bias",
        "plugins/shard-t5/shard_t5/stages.py",
        "T5Stages._run",
        [("            if bias is not None:\n", "            if bias is not None and False:\n")],
        "plugins/shard-t5/tests/test_t5_pipeline.py::test_pipeline_trains_like_unsharded[1f1b-1-3]",
        "pipeline_step loss",
    ),
    m(
        "t5-sequence-split-over-the-decoder",
        "shard-t5 splits the sequence over every block, the decoder's too: its cross-attention's keys and "
        "values, read from the encoder's whole output, are gathered along the sequence again",
        "plugins/shard-t5/shard_t5/policy.py",
        "T5Policy.sequence",
        [
            (
                "            regions=[blocks_in(self.model, encoders[0].block)] if encoders else [],",
                "            regions=None,",
            )
        ],
        "plugins/shard-t5/tests/test_t5_sequence.py::test_split_gather_over_the_encoder_matches_unsharded[t5-tp2]",
        "must match the size of tensor b",
    ),
]
