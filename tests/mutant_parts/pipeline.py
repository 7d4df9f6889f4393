"""Mutants of pipeline: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "pipeline-microbatch-loss-dropped",
        "pipeline: the first microbatch's loss left out of the whole batch's loss",
        "shardcore/pipeline/runtime.py",
        "pipeline_step",
        [("for x in losses]).sum() if losses", "for x in losses[1:]]).sum() if losses")],
        "plugins/shard-llama/tests/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[gpipe]",
        "pipeline_step loss 3.546",
    ),
    m(
        "pipeline-shape-run-uninitialised",
        "the tensors torch runs a stage on to learn its shapes left uninitialised (an index input out of range)",
        "shardcore/pipeline/stage.py",
        "_pipeline_stage",
        [("                    made.zero_()", "                    pass")],
        "tests/test_core_recent_families.py::test_a_stage_that_indexes_a_table_with_its_inputs",
        "IndexError: index",
    ),
    m(
        "pipeline-scale-grads",
        "pipeline: torch's schedule left to divide the gradients by the number of microbatches again",
        "shardcore/pipeline/runtime.py",
        "_make_schedule",
        [('        kwargs["scale_grads"] = False', '        kwargs["scale_grads"] = True')],
        "plugins/shard-llama/tests/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[1f1b-layers13]",
        "gradient of model.embed_tokens.weight (held, gathered over tp): relative error 0.75",
    ),
    m(
        "pipeline-tied-sum-dropped",
        "pipeline: the tied embedding's gradient not summed over the first and last stage",
        "shardcore/pipeline/runtime.py",
        "_after_step",
        [("    for name, group in info.tied:  #", "    for name, group in info.tied[:0]:  #")],
        "plugins/shard-llama/tests/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[gpipe]",
        "gradient of lm_head.weight (held, gathered over tp): relative error",
    ),
    m(
        "pipeline-activations-on-the-default-device",
        "the forward-only pipeline's broadcast buffers made without a device (the CPU on a GPU run)",
        "shardcore/pipeline/runtime.py",
        "_forward_only",
        [
            (
                "            x = tuple(torch.empty(shape, dtype=dtype, device=group_device(info.group)) for",
                "            x = tuple(torch.empty(shape, dtype=dtype) for",
            )
        ],
        "tests/integration/test_llama_device_audit.py::test_every_collective_gets_a_tensor_on_the_model_s_device[pipeline-forward-only]",
        "broadcast (the forward-only pipeline's activations) got a tensor on meta",
    ),
    m(
        "pipeline-last-stages-take-more",
        "an uneven block split gives the last stages the extra block (the first stage also holds the embedding)",
        "shardcore/pipeline/schedule.py",
        "split_layers",
        [("(1 if s < extra else 0)", "(1 if s >= num_stages - extra else 0)")],
        "tests/test_core_pipeline.py::test_even_split_gives_the_first_stages_one_more",
        "5 blocks over 2 stages split as [2, 3]",
        fast=True,
    ),
    m(
        "hole-zero-end-passes-input",
        "a stage's hole for a position embedding hands the hidden states through instead of adding nothing",
        "shardcore/pipeline/hole.py",
        "PipelineHole.forward",
        [("            hidden = torch.zeros(())", "            pass")],
        "plugins/shard-gpt2/tests/test_gpt2_pipeline.py::test_pipeline_trains_like_unsharded[2-1-1F1B]",
        "The size of tensor a (64) must match the size of tensor b (10)",
    ),
    m(
        "non-hf-blocks-return-tuples",
        "a model outside transformers is taken to return (hidden, ...) from its blocks: its holes return tuples",
        "shardcore/pipeline/stage.py",
        "_hf4",
        [("        return False\n    import transformers", "        return True\n    import transformers")],
        "plugins/shard-vit/tests/test_vit_pipeline.py::test_timm_pipeline_trains_like_unsharded[gpipe]",
        "layer_norm(): argument 'input' (position 1) must be Tensor, not tuple",
    ),
    m(
        "pipeline-one-stage-for-multistage",
        "a multi-stage schedule given one stage per rank is not refused",
        "shardcore/pipeline/check.py",
        "_check_schedule",
        [("    if not single and per_rank < 2:", "    if False:")],
        "plugins/shard-llama/tests/test_llama_pipeline.py::test_bad_pipeline_config_is_refused_on_every_rank[multi-stage schedule, one stage per rank]",
        "multi-stage schedule, one stage per rank: refused with 'no error'",
    ),
    m(
        "pipeline-tied-gradients-not-summed",
        "a weight tied across the first and last stages (GPT-2's embedding and head) keeps each stage's gradient",
        "shardcore/pipeline/tied.py",
        "_tied",
        [
            (
                "            if len(owners) > 1:\n                owners_of[pid] = owners",
                "            if False:\n                owners_of[pid] = owners",
            )
        ],
        "plugins/shard-gpt2/tests/test_gpt2_pipeline.py::test_pipeline_trains_like_unsharded[2-1-1F1B]",
        "gradient of lm_head.weight (held, gathered over tp): relative error",
    ),
    m(
        "pipeline-spec-blocks-ignored",
        "the stages are cut from every block of the policy, not the blocks its PipelineSpec names: Llava's "
        "vision layers land on the second stage",
        "shardcore/pipeline/check.py",
        "pipeline_blocks",
        [("    return list(named()) if named is not None else policy.blocks()", "    return policy.blocks()")],
        "plugins/shard-llava/tests/test_llava_pipeline.py::test_pipeline_trains_like_unsharded[pp2-tp2-1f1b-1-3]",
        "summing to the model's 6 blocks",
    ),
    m(
        "stage-first-inputs-dropped",
        "HFStages' first stage leaves out its own inputs (Llava's pixels): image tokens embedded as text",
        "shardcore/integrations/hf/stages.py",
        "HFStages._pp_forward",
        [
            (
                "            entry |= {k: v for k, v in zip(",
                "            entry |= {} if True else {k: v for k, v in zip(",
            )
        ],
        "plugins/shard-llava/tests/test_llava_pipeline.py::test_pipeline_trains_like_unsharded[pp2-gpipe]",
        "pipeline_step loss",
    ),
    m(
        "stage-forward-not-marked",
        "a pipeline stage's forward is not marked as one: the model's forward routes it through the whole pipeline",
        "shardcore/attach/stage.py",
        "running_stage",
        [("    token = _STAGES.set(_STAGES.get() | {id(model)})\n", "    token = _STAGES.set(_STAGES.get())\n")],
        "plugins/shard-llama/tests/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[gpipe]",
        "is split into 2 pipeline stages: train it with shardcore.pipeline_step(model, batch)",
    ),
]
