"""Mutants of testing: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "suite-generates-from-other-weights",
        "the kit's suite builds the sharded model of a generation case from other weights than its reference",
        "shardcore/testing/suite.py",
        "_generates",
        [
            (
                "    torch.manual_seed(0)\n    model = optimize(family.make(case)(), case.shard_config()).eval()\n",
                "    torch.manual_seed(1)\n    model = optimize(family.make(case)(), case.shard_config()).eval()\n",
            )
        ],
        "plugins/shard-bloom/tests/test_bloom_tp.py::test_generate_matches_unsharded[causal-tp2]",
        "!= unsharded",
    ),
    m(
        "kit-output-tolerance-loosened",
        "the kit's output comparison loosened to an absolute 1e-2 (a fixed number, not the output's own size)",
        "shardcore/testing/compare.py",
        "output_close",
        [("    bound = Tolerance(rtol=rtol, atol=OUTPUT.atol).bound(scale)\n", "    bound = 1e-2\n")],
        "tests/test_core_kit_selftest.py::test_kit_fails_on_outputs_a_tenth_of_a_percent_off",
        "DID NOT RAISE",
    ),
    m(
        "kit-step-tolerance-loosened",
        "the kit's parameters-after-steps comparison loosened to an absolute 1e-2 (not the update's own size)",
        "shardcore/testing/steps.py",
        "step_bound",
        [("    return Tolerance(rtol=rtol, atol=STEP.atol).bound(update)\n", "    return 1e-2\n")],
        "tests/test_core_kit_selftest.py::test_kit_fails_on_a_step_off_by_a_share_of_the_update",
        "DID NOT RAISE",
    ),
    m(
        "kit-bound-read-a-thousand-times-looser",
        "every comparison of the kit passes a difference up to a thousand times its bound",
        "shardcore/testing/tolerance.py",
        "within",
        [("    if not diff <= bound:  # NaN fails too\n", "    if not diff <= bound * 1e3:  # NaN fails too\n")],
        "tests/test_core_kit_selftest.py::test_a_comparison_fails_just_past_its_bound_and_records_its_margin",
        "DID NOT RAISE",
    ),
    m(
        "kit-gradient-tolerance-loosened",
        "the kit's gradient check loosened a million times",
        "shardcore/testing/compare.py",
        "_check_grads",
        [
            (
                '        within("gradient", rel, rtol, message)\n',
                '        within("gradient", rel, rtol * 1e6, message)\n',
            )
        ],
        "tests/test_core_kit_selftest.py::test_kit_fails_on_a_gradient_one_percent_off",
        "DID NOT RAISE",
    ),
    m(
        "kit-slice-check-removed",
        "the kits' per-rank gradient check removed (only gathered gradients compared)",
        "shardcore/testing/compare.py",
        "_check_local_grads",
        [('    return _check_grads(pairs, where="this rank\'s slice", **check)', "    return 0.0")],
        "plugins/shard-llama/tests/test_llama_tp.py::test_kit_sees_a_replica_that_diverged",
        "DID NOT RAISE",
    ),
    m(
        "example-main-not-importable",
        "an example loaded by path is not put in sys.modules, so its main cannot reach the ranks",
        "shardcore/testing/examples.py",
        "example_main",
        [("        sys.modules[name] = module\n", "")],
        "tests/integration/test_llama_examples.py::test_pipeline_training_equals_the_unsharded_loop",
        "'shardcore_example_pipeline_training'",
    ),
    m(
        "kit-dropout-always-same",
        "the kit's dropout report says every rank dropped the same positions whatever they dropped",
        "shardcore/testing/sequence.py",
        "dropout_patterns",
        [("        same[path] = all(torch.equal(m, masks[0]) for m in masks)", "        same[path] = True")],
        "plugins/shard-bert/tests/test_bert_sequence.py::test_dropout_on_split_tokens_draws_per_rank_and_replicated_dropout_stays_in_step",
        "every rank dropped the same positions of its own tokens",
    ),
    m(
        "kit-generation-accepts-constant-tokens",
        "the generation check accepts a test input whose unsharded tokens barely vary (it cannot fail)",
        "shardcore/testing/generation.py",
        "assert_generate_matches",
        [("        if len(set(row)) < min_distinct:", "        if False:")],
        "tests/test_core_kit_selftest.py::test_the_generation_check_fails_on_other_tokens_scores_and_inputs_that_cannot_fail[input-that-cannot-fail]",
        "the generation check refused 'nothing (the check passed)', not 'barely vary",
    ),
    m(
        "kit-save-pretrained-untrained",
        "the save_pretrained check saves the sharded model untrained (against the unsharded model trained one step)",
        "shardcore/testing/saving.py",
        "assert_save_pretrained_matches",
        [("    _sharded_backward(model, batch, loss_fn)\n", "")],
        "plugins/shard-gpt2/tests/test_gpt2_user_workflow.py::test_save_pretrained_loads_unsharded",
        Raised("AssertionError", "shardcore/testing/tolerance.py::within"),
    ),
    m(
        "kit-explain-counts-the-first-step",
        "the explain check counts the first step, whose input check adds collectives a steady step does not issue",
        "shardcore/testing/explained.py",
        "assert_explain_matches",
        [("    _loss(model(**inputs), loss_fn).backward()  # the first step: the input check's forward\n", "")],
        "plugins/shard-bloom/tests/test_bloom_tp.py::test_explain_predicts_a_step",
        "this rank put {'forward': {'all_gather': 40976",
    ),
    m(
        "kit-expects-rank-zero-slices",
        "the kit's structural check expects every rank to hold rank 0's slices",
        "shardcore/testing/structure.py",
        "local_expected",
        [
            (
                "            out[name] = spec.shard(tensor, group_rank(group))",
                "            out[name] = spec.shard(tensor, 0)",
            )
        ],
        "tests/test_core_kit_selftest.py::test_kit_passes_the_right_model",
        "this rank's tensor is not its slice of the unsharded parameter",
    ),
    m(
        "kit-keeps-constant-parameters",
        "the kit builds its models as initialized: a norm of ones and zeros hides a norm built anew",
        "shardcore/testing/varied.py",
        "without_constant_parameters",
        [("                if bool((flat == flat[0]).all()):", "                if False:")],
        "tests/test_core_kit_selftest.py::test_kit_fails_on_a_norm_built_anew_instead_of_from_the_model_s_weights",
        "the kit passed a norm built anew (an init of ones hides it): refused 'nothing (the kit passed)'",
    ),
    m(
        "kit-takes-late-refusals",
        "the kit's refusal check takes a refusal raised after a collective as one raised before any",
        "shardcore/testing/refusals.py",
        "refusal_message",
        [('    if message != "no error" and calls and not collectives_allowed:', "    if False:")],
        "tests/test_core_kit_selftest.py::test_kit_flags_a_refusal_that_came_after_a_collective",
        "the kit took a late refusal as early",
    ),
    m(
        "kit-structure-unchecked",
        "the kit skips its structural check (parallel modules, each rank's slices) at every size",
        "shardcore/testing/conformance.py",
        "_structure",
        [("        if info.tp_size > 1:  # (TP=1", "        if info.tp_size > 8:  # (TP=1")],
        "tests/test_core_kit_selftest.py::test_kit_fails_on_one_ranks_slice",
        "Regex pattern did not match",
    ),
    m(
        "kit-clips-with-the-2-norm",
        "the clipping check's user line clips with the 2-norm whatever norm type the test asks",
        "shardcore/testing/clipping.py",
        "_clip",
        [
            (
                "        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=norm_type)",
                "        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=2.0)",
            )
        ],
        "tests/integration/test_llama_clipping.py::test_other_norms[inf]",
        "clip_grad_norm_ (torch, norm_type=inf) on rank 1: norm 3.34",
    ),
    m(
        "kit-every-rank-trains-on-part-zero",
        "the data-parallel check gives every data-parallel rank the batch's first part",
        "shardcore/testing/data_parallel.py",
        "dp_part",
        [("            value = value.chunk(dp_size)[dp_rank]", "            value = value.chunk(dp_size)[0]")],
        "tests/integration/test_llama_data_parallel.py::test_trains_like_unsharded_full_batch[ddp2xtp2]",
        "mean loss over the data-parallel ranks 6.903",
    ),
    m(
        "kit-checkpoints-compared-by-shape",
        "the checkpoint comparison looks at each tensor's shape, not its values",
        "shardcore/testing/checkpoints.py",
        "assert_same_checkpoint",
        [
            (
                "        if got[name].shape != tensor.shape or not torch.equal(got[name], tensor):",
                "        if got[name].shape != tensor.shape:",
            )
        ],
        "tests/test_core_kit_selftest.py::test_the_checkpoint_comparison_fails_on_one_changed_value",
        "the checkpoint comparison refused 'nothing (the check passed)'",
    ),
    m(
        "kit-pipeline-compares-weights-with-gradients",
        "the pipeline check gathers the weights where it means the gradients",
        "shardcore/testing/pipeline.py",
        "_check_held_grads",
        [
            (
                "    pairs = [(n, g, ref_grads[n]) for n, g in shardcore.full_named_tensors(model, grads=True)]",
                "    pairs = [(n, g, ref_grads[n]) for n, g in shardcore.full_named_tensors(model, grads=False)]",
            )
        ],
        "plugins/shard-gpt2/tests/test_gpt2_pipeline.py::test_pipeline_trains_like_unsharded[2-1-GPipe]",
        Raised("AssertionError", "shardcore/testing/tolerance.py::within"),
    ),
    m(
        "device-audit-on-the-cpu",
        "the device-strict audit leaves the default device alone: a buffer made without a device lands on the CPU unseen",
        "shardcore/testing/syncs.py",
        "device_strict",
        [('        with torch.device("meta"):', "        with contextlib.nullcontext():")],
        "tests/test_core_sync.py::test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device",
        "'device': 'cpu'",
    ),
    m(
        "kit-stray-hook-accepted",
        "the attachments check accepts a shardcore hook put on the model outside the registry (listed as torch's)",
        "shardcore/testing/attached.py",
        "assert_attachments_listed",
        [
            (
                '        assert not name.startswith("shardcore."), f"{name} is on the model outside shardcore\'s registry"\n',
                "",
            )
        ],
        "tests/test_core_attach.py::test_the_kit_finds_a_shardcore_hook_outside_the_registry",
        "DID NOT RAISE",
        fast=True,
    ),
]
