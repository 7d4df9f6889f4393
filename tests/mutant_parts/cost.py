"""Mutants of cost: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "auto-memory-cap-ignored",
        "explain --auto ranks every layout as fitting, whatever its bytes per rank and the cap",
        "shardcore/cost/search.py",
        "search",
        [('        row["fits"] = row["memory_bytes"]["total"] <= cap', '        row["fits"] = True')],
        "tests/integration/test_llama_auto.py::test_the_chosen_layout_never_exceeds_the_memory_cap",
        "the cap did not rule out",
    ),
    m(
        "auto-pipeline-bubble-dropped",
        "the cost model's pipeline: every stage starts its first forward at once, not when the previous one's arrives",
        "shardcore/cost/schedule.py",
        "one_f_one_b",
        [
            (
                "    running: list[tuple[float, int]] = [(work[0][0][2], 0)]  # (where it ends, its stage): the first forward\n"
                "    busy, clock, progress = {0}, 0.0, 0.0\n",
                "    running: list[tuple[float, int]] = [(stage_work[0][2], n) for n, stage_work in enumerate(work)]\n"
                "    busy, clock, progress = set(range(len(work))), 0.0, 0.0\n",
            )
        ],
        "tests/integration/test_llama_auto.py::test_a_pipeline_bubble_costs_on_dedicated_devices_and_is_reclaimed_where_ranks_share_them",
        "pipeline bubble",
    ),
    m(
        "auto-pipeline-largest-stage-slots",
        "the cost model's pipeline: every stage's slots the largest stage's, as if a heavy last stage waited on its own",
        "shardcore/cost/schedule.py",
        "one_f_one_b",
        [("        slot = inner[s] * shared / m\n", "        slot = max(inner) * shared / m\n")],
        "tests/test_core_cost.py::test_a_pipeline_waits_on_the_other_stages_single_slots",
        "a heavy last stage's step:",
    ),
    m(
        "pipeline-devices-unshared",
        "the cost model's pipeline on shared devices: every rank with work at its unshared speed, however many",
        "shardcore/cost/schedule.py",
        "one_f_one_b",
        [("    devices = shared * p  #", "    devices = float(p)  #")],
        "tests/test_core_cost.py::test_a_pipeline_waits_on_the_other_stages_single_slots",
        "equal stages on shared devices",
    ),
    m(
        "pipeline-forward-before-the-previous-stage-s",
        "the cost model's pipeline: a stage's forward of a microbatch without waiting for the previous stage's",
        "shardcore/cost/schedule.py",
        "_ready",
        [('        return s == 0 or done[s - 1]["F"] >= i\n', "        return True\n")],
        "tests/test_core_cost.py::test_a_pipeline_waits_on_the_other_stages_single_slots",
        "a forward before the previous stage's",
    ),
    m(
        "pipeline-backward-before-the-next-stage-s",
        "the cost model's pipeline: a stage's backward of a microbatch without waiting for the next stage's",
        "shardcore/cost/schedule.py",
        "_ready",
        [
            (
                '        return done[s]["F"] >= i and (s == p - 1 or done[s + 1]["B"] >= i)\n',
                '        return done[s]["F"] >= i\n',
            )
        ],
        "tests/test_core_cost.py::test_a_pipeline_waits_on_the_other_stages_single_slots",
        "equal stages on their own devices",
    ),
    m(
        "auto-shape-factor-ignored",
        "the cost model's compute at the reference block's rate whatever the rank's microbatch shape",
        "shardcore/cost/model.py",
        "_rates",
        [("    factor = shape_factor(here, dtype, tokens, tp)\n", "    factor = 1.0\n")],
        "tests/test_core_cost.py::test_the_compute_rate_follows_the_rank_s_microbatch_shape",
        "at half the reference block's rate the step took",
    ),
    m(
        "auto-expert-rows-unpriced",
        "the cost model's experts at their microbatch's rate, as if each got every row of it",
        "shardcore/cost/model.py",
        "predict",
        [
            (
                '        experts = tokens * 2 * s.expert_weights / expert_factor(here, facts["dtype"], tokens // m, tp, s.expert_share)\n',
                "        experts = tokens * 2 * s.expert_weights\n",
            )
        ],
        "tests/test_core_cost.py::test_an_expert_s_matmuls_run_at_the_rate_of_the_rows_it_gets",
        "an expert's 16 rows took",
    ),
    m(
        "auto-sequence-traffic-once-a-step",
        "the cost model's sequence split under a pipeline: its per-layer collectives counted once a step, not per microbatch",
        "shardcore/cost/model.py",
        "communication",
        [
            (
                '            out["sp"] += collective_seconds(profile, kind, sp, count * layers * m, nbytes * layers, world)\n',
                '            out["sp"] += collective_seconds(profile, kind, sp, count * layers, nbytes * layers, world)\n',
            )
        ],
        "tests/test_core_cost.py::test_sequence_and_expert_traffic_runs_once_per_microbatch",
        "the sequence's traffic counted once a step",
    ),
    m(
        "auto-expert-dispatch-once-a-step",
        "the cost model's expert dispatch under a pipeline counted once a step, not per microbatch",
        "shardcore/cost/model.py",
        "communication",
        [
            (
                '            profile, "all_to_all", ep, count * stage.blocks * m, per_layer_bytes * stage.blocks, world\n',
                '            profile, "all_to_all", ep, count * stage.blocks, per_layer_bytes * stage.blocks, world\n',
            )
        ],
        "tests/test_core_cost.py::test_sequence_and_expert_traffic_runs_once_per_microbatch",
        "the experts' dispatch counted once a step",
    ),
    m(
        "auto-fsdp-flat-gradients-unpriced",
        "the cost model's FSDP without its units' flat gradient buffers, made anew each step",
        "shardcore/cost/model.py",
        "_data_parallel",
        [
            (
                "        seconds += stage.blocks * fresh_seconds(profile, world, block) + fresh_seconds(profile, world, stage.end_bytes)\n",
                "",
            )
        ],
        "tests/test_core_cost.py::test_a_data_parallel_engine_s_flat_gradients_are_written_into_fresh_buffers",
        "FSDP's units' flat gradients",
    ),
    m(
        "auto-pipeline-ddp-as-buckets",
        "the cost model's DDP under a pipeline priced as DDP's kept buckets, not the stage's replicate",
        "shardcore/cost/model.py",
        "_data_parallel",
        [('    elif dp > 1 and layout["pp"] > 1:', '    elif dp > 1 and layout["pp"] > 99:')],
        "tests/test_core_cost.py::test_a_data_parallel_engine_s_flat_gradients_are_written_into_fresh_buffers",
        "a pipeline stage's replicate: not priced",
    ),
    m(
        "calibrate-fresh-buffer-reused",
        "calibrate's fresh-buffer rate measured into one buffer kept across the calls (a reused buffer's pages)",
        "shardcore/cost/measure.py",
        "_fresh_rate",
        [
            (
                "        rates[str(mib)] = (mib << 20) / _together(lambda src=src: torch.empty_like(src).copy_(src), device)\n",
                "        out = torch.empty_like(src)\n        rates[str(mib)] = (mib << 20) / _together(lambda src=src: out.copy_(src), device)\n",
            )
        ],
        "tests/test_core_cost.py::test_calibrate_measures_once_and_caches",
        "a buffer over the allocator's threshold",
    ),
    m(
        "auto-tied-weight-on-one-stage",
        "the cost facts hold a tied weight (embedding and head) on the first stage using it only, not on each",
        "shardcore/cost/facts.py",
        "stage_facts",
        [
            (
                '        seen = id(p) in acc[stage]["ids"]  # a tied weight is held once on each stage that uses it (its copy there)\n',
                '        seen = any(id(p) in a["ids"] for a in acc)\n',
            )
        ],
        "tests/integration/test_llama_auto.py::test_the_cost_facts_split_a_llama_s_bytes_and_matmul_weights_by_stage_as_counted_by_name",
        "per stage (bytes held, weights a token multiplies by)",
    ),
    m(
        "calibrate-shape-reference-apart",
        "calibrate's block shapes over a reference timed apart from them (here: the smallest shape's rate)",
        "shardcore/cost/measure.py",
        "_blocks",
        [("    reference = rate[1, batch * seq]\n", "    reference = rate[1, min(SHAPE_TOKENS)]\n")],
        "tests/test_core_cost.py::test_calibrate_measures_once_and_caches",
        "the reference shape's factor is",
    ),
    m(
        "auto-optimizer-mean-size",
        "the cost model's optimizer step priced at the mean tensor size: embeddings as cheap per byte as projections",
        "shardcore/cost/model.py",
        "optimizer_seconds",
        [("    sizes = [b / shard for b in stage.dense_sizes] + list(stage.expert_sizes)\n", "    sizes = []\n")],
        "tests/test_core_cost.py::test_the_optimizer_step_is_timed_tensor_by_tensor",
        "not tensor by tensor",
        fast=True,
    ),
    m(
        "auto-loss-on-the-rank-slice",
        "the cost model prices the loss on the rank's slice of the vocabulary where TP gathers the whole logits",
        "shardcore/cost/model.py",
        "predict",
        [
            (
                '        logits = whole * s.logits * facts.get("logits_gathered", 1)',
                "        logits = whole * s.logits",
            )
        ],
        "tests/test_core_cost.py::test_the_loss_is_priced_at_the_measured_rate_over_the_vocabulary_each_rank_computes",
        "the gathered logits: the whole vocabulary",
    ),
    m(
        "auto-loss-rate-unread",
        "the cost model prices the loss as copy passes though the profile measured the cross-entropy's rate",
        "shardcore/cost/model.py",
        "loss_seconds",
        [
            (
                '    rate, copy_rate = here.get("loss_elements_per_s"), here["copy_bytes_per_s"]',
                '    rate, copy_rate = None, here["copy_bytes_per_s"]',
            )
        ],
        "tests/test_core_cost.py::test_the_loss_is_priced_at_the_measured_rate_over_the_vocabulary_each_rank_computes",
        "the loss not at the measured rate",
    ),
    m(
        "auto-loss-rate-read-at-the-step",
        "the loss's rate read at the whole step's logits though a pipeline computes them a microbatch at a time",
        "shardcore/cost/model.py",
        "loss_seconds",
        [("        rate = at_size(rate, elements / max(calls, 1))", "        rate = at_size(rate, elements)")],
        "tests/test_core_cost.py::test_the_loss_is_priced_at_the_measured_rate_over_the_vocabulary_each_rank_computes",
        "a microbatch's call priced whole",
    ),
    m(
        "auto-loss-rate-one-size",
        "the loss priced at the small logits' rate whatever their size (a CPU's cache-resident rate)",
        "shardcore/cost/model.py",
        "loss_seconds",
        [("        rate = at_size(rate, elements / max(calls, 1))", "        rate = max(rate.values())")],
        "tests/test_core_cost.py::test_the_loss_is_priced_at_the_measured_rate_over_the_vocabulary_each_rank_computes",
        "large logits at the small ones' rate",
    ),
    m(
        "auto-loss-timed-at-one-size",
        "calibrate times the cross-entropy at one size of logits only",
        "shardcore/cost/measure.py",
        "_loss_rate",
        [("    for rows in LOSS_ROWS:", "    for rows in LOSS_ROWS[1:2]:")],
        "tests/test_core_cost.py::test_calibrate_measures_once_and_caches",
        "the loss timed at",
    ),
    m(
        "auto-attention-at-the-block-rate",
        "the cost model prices a model's attention FLOPs at the reference block's rate (a causal CPU kernel: half of it)",
        "shardcore/cost/model.py",
        "predict",
        [
            (
                "        flop_s = ((fwd - attention + experts) * rest_s + attention * attention_s) / rate",
                "        flop_s = (fwd + experts) / rate",
            )
        ],
        "tests/test_core_cost_attention.py::test_predict_prices_the_attention_at_its_own_rate_and_the_rest_at_the_block_s_less_its_attention",
        "attention unpriced",
        fast=True,
    ),
    m(
        "auto-attention-mask-unread",
        "the attention's rate read as the unmasked one's for a causal model",
        "shardcore/cost/attention.py",
        "multipliers",
        [('    by_dim = table["causal" if causal else "full"]', '    by_dim = table["full"]')],
        "tests/test_core_cost_attention.py::test_the_multipliers_read_the_head_dim_and_the_mask",
        "the mask not read",
    ),
    m(
        "auto-attention-rest-uncorrected",
        "the rest of a block priced at the whole block's rate, its attention counted twice",
        "shardcore/cost/attention.py",
        "multipliers",
        [
            (
                '    return 1.0 / own, (1.0 - share / table["reference"]) / (1.0 - share)',
                "    return 1.0 / own, 1.0",
            )
        ],
        "tests/test_core_cost_attention.py::test_the_multipliers_read_the_head_dim_and_the_mask",
        "the rest at the whole block's rate",
    ),
    m(
        "calibrate-attention-mask-dropped",
        "calibrate times the masked attention without its mask",
        "shardcore/cost/attention.py",
        "calls",
        [
            (
                '        (mask, dim): call(1, width // dim, SEQ, dim, mask == "causal")',
                "        (mask, dim): call(1, width // dim, SEQ, dim, False)",
            )
        ],
        "tests/test_core_cost_attention.py::test_calibrate_times_each_head_dim_masked_and_not_and_the_reference_block_s_own",
        "the masked attention timed unmasked",
    ),
    m(
        "calibrate-attention-over-its-own",
        "the attention's factors taken over the reference attention's rate, not the block's",
        "shardcore/cost/attention.py",
        "factors",
        [
            (
                "            out[key[0]][str(key[1])] = rate / block_rate",
                '            out[key[0]][str(key[1])] = rate / rates["reference"]',
            )
        ],
        "tests/test_core_cost_attention.py::test_the_reference_attention_s_share_of_the_block_is_what_the_cost_model_counts",
        "not over the block's rate",
    ),
    m(
        "auto-choice-not-broadcast",
        "ShardConfig(auto=...): rank 0's choice (or its error) never sent to the other ranks",
        "shardcore/cost/auto.py",
        "optimize",
        [('    message = broadcast_object(message, 0, where="the automatic layout chosen by rank 0")\n', "")],
        "tests/integration/test_llama_auto.py::test_auto_refuses_alike_on_every_rank_with_what_to_do",
        "the ranks refused unalike",
    ),
    m(
        "auto-table-without-the-chosen",
        "explain --auto's table starts at the runner-up: the chosen layout is missing from it",
        "shardcore/cost/report.py",
        "format_search",
        [
            (
                '    for row in [r for r in result["ranked"] if r["fits"]][:top]:',
                '    for row in [r for r in result["ranked"] if r["fits"]][1:top]:',
            )
        ],
        "tests/integration/test_llama_auto.py::test_explain_auto_prints_the_choice_and_its_config",
        "not the chosen layout",
    ),
    m(
        "cost-attention-heads-not-split",
        "the cost model counts every attention head on each tensor-parallel rank",
        "shardcore/cost/facts.py",
        "attention_width",
        [
            (
                "    return max(1, heads // tp) if heads else 0, dim, causal",
                "    return max(1, heads) if heads else 0, dim, causal",
            )
        ],
        "tests/integration/test_llama_auto.py::test_the_cost_facts_split_a_llama_s_bytes_and_matmul_weights_by_stage_as_counted_by_name",
        "attention facts (4, 16, True)",
    ),
    m(
        "stale-profile-read",
        "a cached machine profile of another shardcore version is read as current",
        "shardcore/cost/profile.py",
        "load_profile",
        [('        if cached.get("version") == VERSION:', "        if True:")],
        "tests/test_core_cost.py::test_a_profile_of_another_version_is_not_read",
        "a profile of version -1 gave 'nothing (the stale profile was read)'",
    ),
    m(
        "paper-build-shared-across-expert-degrees",
        "the search's shared paper build keyed without ep: a layout's experts counted as another ep's",
        "shardcore/cost/search.py",
        "workload_facts",
        [('    key = (tp, sp, layout["mode"], layout["ep"])', '    key = (tp, sp, layout["mode"])')],
        "plugins/shard-moe/tests/test_moe_auto_search.py::test_shared_paper_builds_give_each_layout_the_facts_of_its_own_build",
        "the shared build's facts differ from the layout's own build's",
    ),
    m(
        "sequence-traffic-at-the-global-batch",
        "a shared build's sequence traffic counted for the global batch, not the data-parallel rank's part",
        "shardcore/cost/search.py",
        "_facts",
        [("sequence_bytes(build, seq, batch // dp, itemsize)", "sequence_bytes(build, seq, batch, itemsize)")],
        "plugins/shard-moe/tests/test_moe_auto_search.py::test_shared_paper_builds_give_each_layout_the_facts_of_its_own_build",
        "sequence traffic",
    ),
    m(
        "expert-traffic-at-the-global-batch",
        "a shared build's expert all-to-all bytes counted for the global batch, not the data-parallel rank's part",
        "shardcore/cost/search.py",
        "_facts",
        [("expert_traffic(sharded, seq * (batch // dp), itemsize)", "expert_traffic(sharded, seq * batch, itemsize)")],
        "plugins/shard-moe/tests/test_moe_auto_search.py::test_shared_paper_builds_give_each_layout_the_facts_of_its_own_build",
        "expert traffic",
    ),
    m(
        "module-copy-shares-parameters",
        "the search's model copy shares the parameter dicts: a paper build shards the model it was handed",
        "shardcore/cost/copies.py",
        "module_copy",
        [
            (
                "            elif value is None or type(value) in _ATOMIC:",
                '            elif value is None or type(value) in _ATOMIC or key == "_parameters":',
            )
        ],
        "plugins/shard-moe/tests/test_moe_auto_search.py::test_a_module_copy_is_a_deep_copy_the_sharding_leaves_the_original_untouched",
        "the copy shares an object with the model",
    ),
    m(
        "simulated-rank-built-whole",
        "the tracked rank runs the whole model, not its shard: its memory is every rank's",
        "shardcore/cost/tracked.py",
        "tracked_memory",
        [("        model = shard(_faked(model, fake), config)", "        model = _faked(model, fake)")],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[tp2]",
        "parameters: measured",
    ),
    m(
        "tracker-missing-optimizer-state",
        "the tracked step skips the optimizer's step: its state never counted",
        "shardcore/cost/tracked.py",
        "tracked_memory",
        [("                    opt.step()\n", "")],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[tp2]",
        "optimizer: measured",
    ),
    m(
        "loss-working-set-left-out",
        "explain's activations leave out the loss's float32 logits and the gathered full logits",
        "shardcore/cost/memory.py",
        "memory_per_rank",
        [
            (
                "tokens_mb * (loss + sp * buffers))",
                "tokens_mb * (sp * buffers))",
            )
        ],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[tp2]",
        "explain's activations",
    ),
    m(
        "pipeline-last-stage-loss-counted-on-slices",
        "explain counts a pipeline's last stage's loss as the vocab-parallel one on the rank's slice, not the model's own on the full logits",
        "shardcore/cost/facts.py",
        "loss_bytes_per_token",
        [("    if pipelined:", "    if False:")],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[pp2-tp2-last-stage]",
        "explain's activations",
    ),
    m(
        "fsdp-gathered-weights-left-out",
        "explain leaves out the weights FSDP holds gathered at the peak (its root unit, two blocks)",
        "shardcore/cost/facts.py",
        "gathered_bytes",
        [
            (
                "    return stage.end_bytes + 2 * (stage.dense_bytes - stage.end_bytes) / max(stage.blocks, 1)",
                "    return 0",
            )
        ],
        "tests/integration/test_llama_auto.py::test_fsdp_holds_its_root_unit_and_two_blocks_gathered_at_the_peak",
        Raised(
            "AssertionError",
            "tests/integration/test_llama_auto.py::test_fsdp_holds_its_root_unit_and_two_blocks_gathered_at_the_peak",
        ),
    ),
    m(
        "norm-inputs-left-out",
        "explain leaves out the float32 inputs the norms keep for the backward",
        "shardcore/cost/facts.py",
        "_add_param",
        [('        acc["norm"] += p.numel()', '        acc["norm"] += 0')],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[fsdp2-tp2]",
        "explain's activations",
    ),
    m(
        "cost-batched-experts-counted-by-share",
        "transformers' batched experts counted as if each rank kept rows only for the choices its experts serve: "
        "a Mixtral rank's activations predicted about half what it holds",
        "shardcore/cost/facts.py",
        "_expert_rows",
        [('    if getattr(cfg, "_experts_implementation", None) in (None, "eager"):', "    if True:")],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[mixtral-tp2]",
        "explain's activations",
    ),
    m(
        "split-gather-edges-counted-whole",
        "explain counts a split_gather layout's activations as tensor parallelism alone's: the region's edges and "
        "the norms' inputs whole, not the rank's part of the sequence",
        "shardcore/cost/memory.py",
        "memory_per_rank",
        [('split = layout["tp"] if layout.get("mode") == "split_gather" else 1', "split = 1")],
        "tests/integration/test_llama_auto.py::test_split_gather_keeps_the_regions_edges_and_the_norms_inputs_split",
        "split_gather keeps 0 B fewer activations than TP alone",
    ),
    m(
        "split-gather-edge-per-reader",
        "explain counts a region's entry as the rank's part of the sequence once for each column-parallel layer reading "
        "it (q, k and v), not once",
        "shardcore/cost/sides.py",
        "matmul_sides",
        [("(rows + (0 if shared else width), 0 if shared else width)", "(rows + (0 if shared else width), width)")],
        "tests/integration/test_llama_auto.py::test_split_gather_keeps_the_regions_edges_and_the_norms_inputs_split",
        "fewer activations than TP alone, not",
    ),
    m(
        "regather-key-by-data-pointer",
        "split_gather's hooks know the gathered input by its data pointer: on the tracked rank (fake tensors, every "
        "pointer 0) every tensor saved is taken for it and kept as a slice",
        "shardcore/tensor_parallel/regions.py",
        "storage_key",
        [("t.untyped_storage()._cdata", "t.untyped_storage().data_ptr()")],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[tp2-split_gather]",
        "explain's activations",
    ),
    m(
        "named-profile-measured-over",
        "a profile file the user names that is of another version is measured over (a committed profile replaced by "
        "this machine's), not refused",
        "shardcore/cost/profile.py",
        "load_profile",
        [("        if path and measure and not replace:", "        if False:")],
        "tests/test_core_cost.py::test_a_named_profile_of_another_version_is_refused_not_measured_over",
        "the named profile was measured over",
    ),
    m(
        "kept-input-counted-per-reader",
        "explain counts the input q, k and v (gate and up) read once for each of them, not the one tensor kept once",
        "shardcore/cost/sides.py",
        "matmul_sides",
        [("(rows + (0 if shared else width), 0 if shared else width)", "(rows + width, 0 if shared else width)")],
        "tests/integration/test_llama_auto.py::test_a_block_keeps_each_tensor_its_backward_reads_once",
        "TP=2: model.layers.0.self_attn.k_proj.weight leaves",
    ),
    m(
        "row-parallel-output-counted",
        "explain counts a row-parallel layer's output as kept, where it goes into the residual sum, which keeps nothing",
        "shardcore/cost/sides.py",
        "matmul_sides",
        [('if role == "col" else (width, 0)', 'if role == "col" else (width + rows, 0)')],
        "tests/integration/test_llama_auto.py::test_a_block_keeps_each_tensor_its_backward_reads_once",
        "TP=2: model.layers.0.self_attn.o_proj.weight leaves",
    ),
    m(
        "gated-activation-left-out",
        "explain leaves out the output of a gated unit's activation, which the product's backward reads",
        "shardcore/cost/sides.py",
        "matmul_sides",
        [("out[id(child)] = (out[id(child)][0] + rows, 0)", "out[id(child)] = (out[id(child)][0], 0)")],
        "tests/integration/test_llama_auto.py::test_a_block_keeps_each_tensor_its_backward_reads_once",
        "TP=2: model.layers.0.mlp.up_proj.weight leaves",
    ),
    m(
        "planned-roles-unread",
        "explain counts each matmul's input and output at TP=1, the policy's plan not read for the layers' roles",
        "shardcore/cost/search.py",
        "workload_facts",
        [("roles = planned_roles(build.model, build.policy) if tp == 1 else None", "roles = None")],
        "tests/integration/test_llama_auto.py::test_a_block_keeps_each_tensor_its_backward_reads_once",
        "TP=1: model.layers.0.self_attn.k_proj.weight leaves",
    ),
    m(
        "norm-copy-left-out",
        "explain leaves out the normalized copy a norm written in Python keeps for its weight's product",
        "shardcore/cost/facts.py",
        "_add_param",
        [('            acc["act"] += p.numel()  # model', '            acc["act"] += 0  # model')],
        "tests/integration/test_llama_auto.py::test_a_block_keeps_each_tensor_its_backward_reads_once",
        "TP=2: model.layers.0.input_layernorm.weight leaves",
    ),
    m(
        "backward-working-set-left-out",
        "explain leaves out the working set of a block's backward on a pipeline stage without the loss",
        "shardcore/cost/memory.py",
        "memory_per_rank",
        [("acts += int(BACKWARD_WORKING * one", "acts += int(0 * one")],
        "tests/integration/test_llama_auto.py::"
        "test_a_pipeline_stage_holds_a_receive_buffer_a_microbatch_for_each_neighbour",
        "the first stage's activations 450560 B",
    ),
    m(
        "fsdp-backward-unwalked",
        "explain puts FSDP's peak at its backward's start with two blocks gathered, never walks the backward",
        "shardcore/cost/memory.py",
        "memory_per_rank",
        [
            (
                'if pp == 1 and layout["data_parallel"] in ("fsdp", "hsdp")',
                'if False and layout["data_parallel"] in ("fsdp", "hsdp")',
            )
        ],
        "tests/integration/test_llama_auto.py::test_fsdp_walks_its_backward_to_where_it_holds_the_most",
        "at the backward's start the root unit alone is gathered",
    ),
    m(
        "fsdp-buffers-left-out",
        "explain leaves out FSDP's all-gather and reduce-scatter buffers through the backward",
        "shardcore/cost/memory.py",
        "_sharded_walk",
        [("SHARDED_BUFFERS[0] * block)]", "0 * block)]")],
        "tests/integration/test_llama_auto.py::test_fsdp_walks_its_backward_to_where_it_holds_the_most",
        "every activation and the last all-gather's block",
    ),
    m(
        "fsdp-head-gradient-left-out",
        "explain's FSDP walk leaves out the head's gradient, unsharded until the root's reduce-scatter at the end",
        "shardcore/cost/memory.py",
        "_sharded_walk",
        [("held = stage.tail_bytes + (k - 1)", "held = 0 + (k - 1)")],
        "tests/integration/test_llama_auto.py::test_fsdp_walks_its_backward_to_where_it_holds_the_most",
        "is not the walk's",
    ),
    m(
        "pipeline-receive-buffers-left-out",
        "explain leaves out the receive buffers torch's pipeline stage allocates a microbatch for its input and its "
        "output's gradient",
        "shardcore/cost/memory.py",
        "memory_per_rank",
        [("buffers = ((s > 0) + (s < pp - 1)) * m", "buffers = 0 * m")],
        "tests/integration/test_llama_auto.py::"
        "test_a_pipeline_stage_holds_a_receive_buffer_a_microbatch_for_each_neighbour",
        "the first stage's activations 487424 B",
    ),
    m(
        "optimizer-step-peak-left-out",
        "explain's peak is the backward's alone: the optimizer step's temporaries beside the parameters, gradients "
        "and state left out",
        "shardcore/cost/memory.py",
        "memory_per_rank",
        [
            (
                '        row["total"] = max(sum(row.values()) - params + held, step)',
                '        row["total"] = sum(row.values()) - params + held',
            )
        ],
        "tests/integration/test_llama_auto.py::test_the_optimizers_step_is_a_peak_of_its_own",
        "the optimizer step's peak 1446912 B",
    ),
    m(
        "optimizer-step-temporaries-of-the-smallest-tensor",
        "the optimizer step's temporaries sized by the rank's smallest tensor, not its largest",
        "shardcore/cost/facts.py",
        "step_temporaries",
        [("    largest = max(", "    largest = min(")],
        "tests/integration/test_llama_auto.py::test_the_optimizers_step_is_a_peak_of_its_own",
        "the optimizer step's peak 1447680 B",
    ),
    m(
        "pipeline-receive-buffers-on-both-sides-of-every-stage",
        "explain gives every pipeline stage both receive buffers, the first stage its input's and the last its "
        "output's gradient too",
        "shardcore/cost/memory.py",
        "memory_per_rank",
        [("buffers = ((s > 0) + (s < pp - 1)) * m", "buffers = 2 * m")],
        "tests/integration/test_llama_auto.py::"
        "test_a_pipeline_stage_holds_a_receive_buffer_a_microbatch_for_each_neighbour",
        "the first stage's activations",
    ),
    m(
        "tracked-mask-built-from-fake-tensors",
        "the tracked rank's mask builders not told the batch is unpadded: transformers builds the whole causal mask "
        "from the fake all-ones mask a pipeline stage is handed, which a real run skips",
        "shardcore/cost/tracked.py",
        "tracked_memory",
        [("        with tracker, _unpadded(model):", "        with tracker:")],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[pp4-tp2-middle-stage]",
        "explain's activations",
    ),
    m(
        "unpadded-masks-keep-the-padding-mask",
        "the registry's unpadded switches the implementation but hands its mask builder the padding mask still",
        "shardcore/integrations/hf/unpadded.py",
        "_unpadded",
        [('        kwargs["attention_mask"] = None', "        pass")],
        "tests/test_core_tracked_memory.py::"
        "test_the_mask_builders_told_the_batch_is_unpadded_skip_the_mask_a_fake_tensor_would_make",
        "the builder still made a",
    ),
    m(
        "unpadded-masks-leave-the-model-switched",
        "the registry's unpadded leaves the model on its own registry name after the measurement",
        "shardcore/integrations/hf/unpadded.py",
        "unpadded_masks",
        [("            if name is not None:\n                _set(config, name)\n", "            pass\n")],
        "tests/test_core_tracked_memory.py::"
        "test_the_mask_builders_told_the_batch_is_unpadded_skip_the_mask_a_fake_tensor_would_make",
        "the model's attention implementation left as",
    ),
    m(
        "pipeline-warm-up-stage-holds-gradients-beside-every-microbatch",
        "explain's pipeline stage whose warm-up runs every microbatch counted with its gradients beside them all",
        "shardcore/cost/memory.py",
        "_overlap",
        [('    if layout["microbatches"] > in_flight:', '    if layout["microbatches"] >= in_flight:')],
        "tests/integration/test_llama_auto.py::"
        "test_a_stage_whose_warm_up_runs_every_microbatch_peaks_where_its_first_backward_holds_the_most",
        "every microbatch held beside the gradients",
    ),
    m(
        "backward-walk-in-module-order",
        "explain's first backward walks the parameters in module order: a dense first stage's embeddings' gradient "
        "allocated first, beside every microbatch",
        "shardcore/cost/facts.py",
        "backward_peak",
        [("zip(reversed(stage.walk), reversed(weights), strict=True)", "zip(stage.walk, weights, strict=True)")],
        "tests/integration/test_llama_auto.py::"
        "test_a_stage_whose_warm_up_runs_every_microbatch_peaks_where_its_first_backward_holds_the_most",
        "seq 8: the backward's end",
    ),
    m(
        "elementwise-reference-share-priced-again",
        "the cost model's elementwise work priced whole, the reference block's share its rate holds not taken off",
        "shardcore/cost/excess.py",
        "excess_seconds",
        [("    return mine - flops * nbytes / at_size(rates, nbytes / ops) / ref_flops", "    return mine")],
        "tests/test_core_cost_elementwise.py::test_elementwise_work_is_priced_beyond_the_reference_block_s_share",
        "the reference block's own elementwise work priced again",
    ),
    m(
        "elementwise-split-kept-whole",
        "the cost model's elementwise bytes under TP: the MLP's and the heads' tensors kept whole on every rank",
        "shardcore/cost/excess.py",
        "excess_seconds",
        [('(traced["whole"] + traced["split"] / tp)', '(traced["whole"] + traced["split"])')],
        "tests/test_core_cost_elementwise.py::test_elementwise_work_is_priced_beyond_the_reference_block_s_share",
        "under TP the residual stream split, or the MLP's tensors kept whole",
    ),
    m(
        "elementwise-views-counted",
        "the elementwise trace counts a view's tensors as bytes moved",
        "shardcore/cost/elementwise.py",
        "_Counter.__torch_dispatch__",
        [(" or any(r.alias_info is not None for r in func._schema.returns):", ":")],
        "tests/test_core_cost_elementwise.py::test_the_trace_counts_elementwise_bytes_by_how_they_scale_not_matmuls_or_views",
        "views counted as bytes moved",
    ),
    m(
        "elementwise-attention-decomposed",
        "the elementwise trace takes SDPA as the meta device decomposes it (its scores written), not as a fused kernel",
        "shardcore/cost/elementwise.py",
        "count",
        [("    with _Fused(), counter:", "    with counter:")],
        "tests/test_core_cost_elementwise.py::test_the_trace_counts_elementwise_bytes_by_how_they_scale_not_matmuls_or_views",
        "attention's scores counted",
    ),
    m(
        "elementwise-per-call-bytes-per-token",
        "the elementwise trace counts a tensor without a dimension of the tokens (the embedding's gradient) per token",
        "shardcore/cost/elementwise.py",
        "_Counter.__torch_dispatch__",
        [("            if not any(d % self.tokens == 0 for d in t.shape):", "            if False:")],
        "tests/test_core_cost_elementwise.py::test_the_trace_counts_elementwise_bytes_by_how_they_scale_not_matmuls_or_views",
        "the embedding's gradient counted per token",
    ),
    m(
        "elementwise-every-stage-pays-the-model-s",
        "the cost model's pipeline stage pays the whole model's elementwise work, not its share",
        "shardcore/cost/model.py",
        "predict",
        [("        share = flops / max(sum(forward), 1.0)", "        share = 1.0")],
        "tests/test_core_cost_elementwise.py::test_a_stage_pays_its_share_of_the_model_s_elementwise_work",
        "a stage's share by FLOPs",
    ),
    m(
        "curve-read-as-steps",
        "the cost model reads a measured curve (a rate by size or shape) as steps between its points, not linearly",
        "shardcore/cost/curves.py",
        "interpolate",
        [("            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)", "            return y0")],
        "tests/test_core_cost.py::test_the_compute_rate_follows_the_rank_s_microbatch_shape",
        "not log-linear between the measured points",
    ),
]
