"""Mutants of data_parallel: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "fsdp-block-skipped",
        "FSDP: fully_shard skipped on the first block (its weights stay whole on every dp rank)",
        "shardcore/data_parallel/__init__.py",
        "apply_data_parallel",
        [("            for block in blocks:\n", "            for block in blocks[1:]:\n")],
        "tests/integration/test_llama_data_parallel.py::test_trains_like_unsharded_full_batch[fsdp2xtp2]",
        "are not wrapped by fully_shard",
    ),
    m(
        "pipeline-stage-ends-not-data-parallel",
        "under pipeline x FSDP only the blocks are wrapped: the stage's embedding, norm and head are never reduced",
        "shardcore/data_parallel/__init__.py",
        "apply_data_parallel",
        [
            (
                "                fully_shard(block, mesh=mesh, **kwargs)\n            fully_shard(root, mesh=mesh, **kwargs)\n",
                "                fully_shard(block, mesh=mesh, **kwargs)\n",
            )
        ],
        "tests/integration/test_llama_pipeline_data_parallel.py::test_pp2_x_dp2_trains_like_unsharded[fsdp-1f1b]",
        "(held, gathered over tp): relative error",
    ),
    m(
        "hsdp-on-the-flat-mesh",
        "data_parallel='hsdp' runs on the 1-D dp mesh: plain FSDP, nothing replicated",
        "shardcore/data_parallel/__init__.py",
        "dp_mesh",
        [
            (
                '    if config.data_parallel == "hsdp":\n        return layout.hsdp_mesh',
                "    if False:\n        return layout.hsdp_mesh",
            )
        ],
        "tests/integration/test_llama_data_parallel.py::test_trains_like_unsharded_full_batch[hsdp2x2]",
        "HSDP wants a (replicate, shard=2) mesh",
    ),
    m(
        "zero2-reshards-after-forward",
        "data_parallel='zero2' without reshard_after_forward=False: plain FSDP's memory and traffic",
        "shardcore/data_parallel/__init__.py",
        "apply_data_parallel",
        [('            kwargs["reshard_after_forward"] = False\n', "            pass\n")],
        "tests/integration/test_llama_data_parallel.py::test_trains_like_unsharded_full_batch[zero2xtp2]",
        "weights kept gathered after forward: {False}",
    ),
    m(
        "mixed-precision-ignored",
        "ShardConfig(mixed_precision='bf16') accepted but FSDP's MixedPrecisionPolicy never given",
        "shardcore/data_parallel/__init__.py",
        "_fsdp_kwargs",
        [("    if config.mixed_precision is not None:  # compute in it", "    if False:  # compute in it")],
        "tests/integration/test_llama_data_parallel.py::test_bf16_mixed_precision_fsdp_x_tp_within_bf16_of_the_unsharded_autocast_run",
        "the sharded model computed in torch.float32, not bf16",
    ),
    m(
        "idle-run-skipped",
        "a data-parallel rank whose batch has no image skips the vision tower: FSDP's collectives mismatch across ranks",
        "shardcore/data_parallel/idle.py",
        "install_idle_runs.run.before",
        [("            if name in lacking:", "            if False:")],
        "plugins/shard-llava/tests/test_llava_card.py::test_the_card_passes_with_an_image_on_one_data_parallel_rank_only[fsdp]",
        "rank_numbers failed on",
    ),
    m(
        "idle-run-result-carried-whole",
        "the idle run's result added to the hidden states as it is, not times zero: a text-only part computes on a blank image",
        "shardcore/data_parallel/idle.py",
        "install_idle_runs.carry",
        [
            (
                "        zero = sum(t.float().sum() for t in pending) * 0.0",
                "        zero = sum(t.float().sum() for t in pending) * 1.0",
            )
        ],
        "plugins/shard-llava/tests/test_llava_card.py::test_the_card_passes_with_an_image_on_one_data_parallel_rank_only[ddp]",
        "FAIL: loss, step 1",
    ),
    m(
        "ddp-static-graph-not-told",
        "DDP not told that every step uses the same parameters: it waits for Llava's post_layernorm, never used, and fails",
        "shardcore/data_parallel/__init__.py",
        "apply_data_parallel",
        [('        kwargs = {"static_graph": spec.static_graph,', '        kwargs = {"static_graph": False,')],
        "plugins/shard-llava/tests/test_llava_card.py::test_the_card_passes_with_images_on_every_rank_under_ddp",
        "Expected to have finished reduction in the prior iteration",
    ),
    m(
        "fsdp-sharded-refusal-ignored",
        "FSDP run where the policy says it cannot be (experts beside zero-computation ones): the ranks' "
        "reduce-scatters differ",
        "shardcore/data_parallel/__init__.py",
        "check_data_parallel",
        [("policy.data_parallel().sharded_refusal", "None")],
        "tests/test_core_recent_families.py::test_experts_beside_zero_computation_ones_under_data_parallelism",
        "FSDP not refused beside zero-computation experts: no error",
    ),
    m(
        "idle-run-not-on-pipeline-stages",
        "under pipeline x data parallelism the first stage of a rank without an image skips the vision tower",
        "shardcore/data_parallel/__init__.py",
        "apply_data_parallel",
        [
            (
                "        if 0 in pipeline.submods:  # the first stage takes the inputs and holds their modules",
                "        if False:",
            )
        ],
        "plugins/shard-llava/tests/test_llava_card.py::test_pipeline_stages_over_data_parallel_ranks_with_an_image_on_one_rank_only[fsdp-1F1B]",
        "rank_numbers failed on",
    ),
    m(
        "idle-run-noted-at-the-whole-model-on-stages",
        "on a pipeline stage the inputs are noted at the whole model's forward, which the stage never calls",
        "shardcore/data_parallel/idle.py",
        "install_idle_runs",
        [("        for module in stage_takers(model, runs):", "        for module in [model]:")],
        "plugins/shard-llava/tests/test_llava_card.py::test_pipeline_stages_over_data_parallel_ranks_with_an_image_on_one_rank_only[ddp-1F1B]",
        "rank_numbers failed on",
    ),
    m(
        "idle-run-on-every-stage-of-the-rank",
        "the inputs noted whichever stage runs: an interleaved rank's later stage runs the tower idle through its holes",
        "shardcore/data_parallel/idle.py",
        "install_idle_runs.note",
        [
            (
                "        wanted = running[0] and torch.is_grad_enabled() and module.training",
                "        wanted = torch.is_grad_enabled() and module.training",
            )
        ],
        "plugins/shard-llava/tests/test_llava_card.py::test_pipeline_stages_over_data_parallel_ranks_with_an_image_on_one_rank_only[fsdp-Interleaved1F1B]",
        "rank_numbers failed on",
    ),
    m(
        "idle-run-stage-without-takers-unrefused",
        "pipeline stages whose idle run has no module taking the input by name go on silently: the mismatch returns",
        "shardcore/data_parallel/idle.py",
        "stage_takers",
        [("        if not found:", "        if False:")],
        "tests/test_core_idle_stages.py::test_the_stage_notes_the_input_where_a_module_takes_it_by_name",
        "DID NOT RAISE",
    ),
]
