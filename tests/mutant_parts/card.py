"""Mutants of card (``shardcore check``): each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "card-gradients-of-one-rank-only",
        "the card merges the gradients of the first rank only: a pipeline's later stages, another rank's slice, unseen",
        "shardcore/card/rows.py",
        "card_from_ranks",
        [
            (
                '        for name, error in r["gradients"].items():',
                '        for name, error in ranks[0]["gradients"].items():',
            )
        ],
        "tests/test_core_card.py::test_a_wrong_number_fails_the_card_naming_its_part_parameter_and_size",
        Raised(
            "AssertionError",
            "tests/test_core_card.py::test_a_wrong_number_fails_the_card_naming_its_part_parameter_and_size",
        ),
        fast=True,
    ),
    m(
        "card-reference-on-the-whole-batch",
        "the unsharded loss taken on the whole batch, not as data parallelism averages it (the mean of its parts' losses)",
        "shardcore/card/rank.py",
        "_reference_loss",
        [
            (
                "    loss = sum(_step_loss(ref, part, loss_fn) for part in parts) / len(parts)",
                "    loss = _step_loss(ref, {k: (torch.cat([p[k] for p in parts]) if isinstance(parts[0][k], torch.Tensor) else parts[0][k]) for k in parts[0]}, loss_fn)",
            )
        ],
        "tests/integration/test_llama_card.py::test_the_card_of_a_right_layout_passes_with_every_part_compared[ulysses2-fsdp2]",
        "FAIL: loss, step 1",
    ),
    m(
        "card-reduction-drops-layer-types",
        "a reduced config keeps the first layers whatever their types: Gemma 3's global layer cut away",
        "shardcore/card/source.py",
        "_layer_count",
        [("    while types and set(types[:n]) != set(types) and n < len(types):", "    while False:")],
        "tests/test_core_card.py::test_a_reduced_config_keeps_what_the_layout_depends_on",
        Raised("AssertionError", "tests/test_core_card.py::test_a_reduced_config_keeps_what_the_layout_depends_on"),
    ),
    m(
        "card-vision-tower-counted-as-attention",
        "the card's parts ignore a vision tower: its gradients land among the language model's attention and MLP",
        "shardcore/card/parts.py",
        "parts_of",
        [("        if any(w.startswith(_VISION) or w.endswith(_VISION) for w in words):", "        if False:")],
        "tests/test_core_card.py::test_vision_gpt2_and_bert_parameters_fall_in_their_parts",
        Raised("AssertionError", "tests/test_core_card.py::test_vision_gpt2_and_bert_parameters_fall_in_their_parts"),
    ),
    m(
        "check-not-exposed",
        "shardcore.check missing from the package: the documented one call raises AttributeError",
        "shardcore/__init__.py",
        "__getattr__",
        [('    if name == "check":', "    if False:")],
        "tests/test_core_card.py::test_shardcore_check_is_the_card_s_check",
        Raised("AttributeError", "shardcore/__init__.py::__getattr__"),
    ),
    m(
        "check-refusal-unread",
        "optimize's refusal returned by the ranks is never read: the card crashes on the missing numbers",
        "shardcore/card/__init__.py",
        "check",
        [("    if refusals:", "    if False:")],
        "tests/integration/test_llama_card.py::test_a_refused_layout_ends_with_optimize_s_message",
        Raised(
            "AssertionError", "tests/integration/test_llama_card.py::test_a_refused_layout_ends_with_optimize_s_message"
        ),
    ),
    m(
        "check-dp-without-its-mode",
        "shardcore check --dp 2 without --data-parallel let through: the ranks are asked for a layout optimize refuses",
        "shardcore/card/command.py",
        "_config",
        [("        if not args.data_parallel:", "        if False:")],
        "tests/integration/test_llama_card.py::test_bad_input_is_refused_before_any_process_starts",
        Raised(
            "AssertionError",
            "tests/integration/test_llama_card.py::test_bad_input_is_refused_before_any_process_starts",
        ),
    ),
    m(
        "check-loss-fn-on-the-reference-only",
        "shardcore check hands loss_fn to the unsharded model only: the sharded one is called as a model with a loss",
        "shardcore/card/rank.py",
        "rank_numbers",
        [
            (
                "                loss = _step_loss(model, mine, loss_fn)",
                "                loss = _step_loss(model, mine, None)",
            )
        ],
        "tests/test_core_own_model.py::test_check_takes_the_users_own_loss_for_a_plain_module",
        "NanoLM.forward() got an unexpected keyword argument 'labels'",
    ),
    m(
        "check-loss-fn-with-a-pipeline",
        "shardcore check lets loss_fn through with a pipeline, whose last stage computes the model's own loss",
        "shardcore/card/__init__.py",
        "check",
        [("    if loss_fn is not None and config.pipeline_parallel_size > 1:", "    if False:")],
        "tests/test_core_own_model.py::test_check_takes_the_users_own_loss_for_a_plain_module",
        Raised(
            "AssertionError", "tests/test_core_own_model.py::test_check_takes_the_users_own_loss_for_a_plain_module"
        ),
    ),
    m(
        "large-world-built-at-the-small-world",
        "a world above the machine is built at 2 per dimension, as its numbers are checked: the whole world's divisibility and stages never built",
        "shardcore/card/__init__.py",
        "_check_large",
        [
            (
                '    built = build_world(source, _with_stage_shapes(config, kwargs.get("batch"), hf_config), world, kwargs["progress"])',
                '    small = scaled_layouts(config)[0]\n    built = build_world(source, _with_stage_shapes(small, kwargs.get("batch"), hf_config), world_of(small), kwargs["progress"])',
            )
        ],
        "tests/integration/test_llama_card.py::test_a_world_larger_than_the_machine_is_built_whole_and_checked_at_two_per_dimension",
        Raised(
            "AssertionError",
            "tests/integration/test_llama_card.py::test_a_world_larger_than_the_machine_is_built_whole_and_checked_at_two_per_dimension",
        ),
    ),
    m(
        "large-world-builds-rank-zero-only",
        "the whole world's build plays rank 0 alone: a later stage's layers, another tensor-parallel rank's shard unbuilt",
        "shardcore/card/large.py",
        "sampled_ranks",
        [("    return sorted(seen)", "    return [0]")],
        "tests/test_core_card.py::test_the_built_ranks_take_every_coordinate_of_every_dimension",
        Raised(
            "AssertionError", "tests/test_core_card.py::test_the_built_ranks_take_every_coordinate_of_every_dimension"
        ),
    ),
    m(
        "large-world-held-row-blind",
        "the whole world's row passes whatever the built ranks hold: a parameter no rank holds goes unseen",
        "shardcore/card/large.py",
        "world_rows",
        [("    if missing:", "    if False:")],
        "tests/test_core_card.py::test_a_parameter_no_built_rank_holds_fails_the_whole_world_s_row",
        Raised(
            "AssertionError",
            "tests/test_core_card.py::test_a_parameter_no_built_rank_holds_fails_the_whole_world_s_row",
        ),
    ),
    m(
        "large-world-dimensions-run-alone",
        "a world above the machine is checked one dimension at a time: no two dimensions ever run together",
        "shardcore/card/large.py",
        "scaled_layouts",
        [("        for r in range(len(active), 0, -1)", "        for r in range(1, len(active) + 1)")],
        "tests/test_core_card.py::test_a_world_above_the_machine_runs_each_dimension_at_two_every_pair_together",
        Raised(
            "ValueError",
            "tests/test_core_card.py::test_a_world_above_the_machine_runs_each_dimension_at_two_every_pair_together",
        ),
    ),
    m(
        "simulated-stage-microbatches-unset",
        "a simulated pipeline rank reads num_microbatches as given: its default (None) breaks the stage shapes",
        "shardcore/pipeline/simulated.py",
        "stage_shapes",
        [("    micro = config.num_microbatches or num_stages", "    micro = config.num_microbatches")],
        "tests/integration/test_llama_card.py::test_a_world_larger_than_the_machine_is_built_whole_and_checked_at_two_per_dimension",
        "at 16 ranks: TypeError",
    ),
    m(
        "card-reference-norm-in-float32",
        "the unsharded reference norm (the card's, the clipping kit's) summed in float32: on an AVX2 CPU a large head's norm misses by 2.5e-4, failing a right layout",
        "shardcore/testing/clipping.py",
        "exact_norm",
        [
            (
                "    norms = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float64) for g in grads]",
                "    norms = [torch.linalg.vector_norm(g, norm_type) for g in grads]",
            )
        ],
        "tests/test_core_card.py::test_the_reference_norm_is_summed_in_float64",
        Raised("AssertionError", "tests/test_core_card.py::test_the_reference_norm_is_summed_in_float64"),
    ),
]
