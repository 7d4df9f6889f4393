"""Mutants of plan: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "plan-axis-used-twice",
        "the plan reader lets one mesh axis split two dimensions of a tensor (each rank then holds a corner)",
        "shardcore/plan/syntax.py",
        "_check_spec",
        [("        if spec is not None and sum(a == axis for a in spec) > 1:", "        if False:")],
        "tests/test_core_plan.py::test_plan_syntax[plan0-splits more than one dimension]",
        "was read without an error (expected: splits more than one dimension)",
    ),
    m(
        "plan-returns-the-vocab-slice",
        "a plan's head on a plain model returns each rank's vocabulary slice again (no split found leaving)",
        "shardcore/plan/policy.py",
        "PlanPolicy._heads",
        [("        return heads | leave\n", "        return heads\n")],
        "tests/test_core_own_model.py::test_the_head_s_split_comes_back_whole",
        "the head's split came back as each rank's slice",
    ),
    m(
        "flow-walks-through-rows",
        "the walk from the model's outputs goes on past a row-parallel layer (every column found leaving)",
        "shardcore/plan/flow.py",
        "_walk",
        [('        if kind == "row":  # the split was reduced here\n            continue\n', "")],
        "tests/test_core_own_model.py::test_splits_reduced_inside_the_model_are_not_gathered",
        "a column was taken for leaving the model",
    ),
    m(
        "plan-embedding-split-over-width",
        "a plan splitting an embedding over its width (not the vocabulary) is taken as a vocabulary split",
        "shardcore/plan/layers.py",
        "Layers.layer",
        [
            (
                "            if dim != 0:\n                raise PlanError(",
                "            if False:\n                raise PlanError(",
            )
        ],
        "tests/integration/test_llama_plan.py::test_bad_plans_are_refused_early_on_every_rank[embedding width]",
        "embedding width: refused with 'no error'",
    ),
    m(
        "derive-without-blocks-unnamed",
        "a model with no repeated blocks to derive a plan from fails on a None instead of a PlanError naming it",
        "shardcore/plan/derive.py",
        "derived_plan",
        [("    if found is None:\n        raise PlanError(", "    if False:\n        raise PlanError(")],
        "tests/test_core_verify.py::test_derive_names_what_it_could_not_read",
        "cannot unpack non-iterable NoneType object",
        fast=True,
    ),
    m(
        "zero-config-unknown-style-accepted",
        "a shipped tp_plan style zero-config does not translate is not refused by name",
        "shardcore/plan/zero_config.py",
        "hf_tp_plan",
        [("            if find_style(style) is None:", "            if False:")],
        "tests/test_core_zero_config.py::test_unsupported_tp_style_is_named",
        "DID NOT RAISE PlanError",
    ),
    m(
        "plan-tie-split-two-ways",
        "a plan giving two names of one tied parameter different specs is not refused",
        "shardcore/plan/policy.py",
        "PlanPolicy._check_ties",
        [
            (
                "            if split and (len(split) != len(tied) or len({tuple(s) for s in split.values()}) > 1):",
                "            if False:",
            )
        ],
        "tests/test_core_plan.py::test_tied_parameters_need_one_spec",
        "calls to other ranks: ShardingCheckError",
    ),
    m(
        "colwise-style-read-as-rowwise",
        "a plan's colwise style on a plain linear weight becomes a row split",
        "shardcore/plan/styles.py",
        "_column_spec",
        [('    return ["tp"] if _bias(name) else ["tp", None]', '    return ["tp"] if _bias(name) else [None, "tp"]')],
        "tests/test_core_plan.py::test_a_plan_s_style_names_become_the_specs_its_table_gives",
        "the styles became {('weight', 'colwise'): [None, 'tp']",
    ),
    m(
        "style-name-taken-twice",
        "a plugin registering a plan style under a taken name (colwise) silently replaces the built-in one",
        "shardcore/plan/registry.py",
        "register_style",
        [("    if style.name in _STYLES and not replace and _STYLES[style.name] is not style:\n", "    if False:\n")],
        "tests/test_core_plan_styles.py::test_a_second_style_of_a_taken_name_is_refused",
        "DID NOT RAISE",
    ),
    m(
        "plan-blocks-only-where-planned",
        "a plan's blocks looked for only among its planned modules: a plan naming only the ends (GPT-OSS's) "
        "leaves FSDP no block",
        "shardcore/plan/policy.py",
        "PlanPolicy.blocks",
        [
            (
                "        for names in (list(plans), [n for n, _ in self.model.named_parameters()]):",
                "        for names in (list(plans),):",
            )
        ],
        "tests/test_core_recent_families.py::test_fsdp_finds_the_blocks_of_a_plan_that_names_only_the_ends",
        "PlanPolicy.blocks() is empty",
    ),
    m(
        "shipped-stages-last-ends-dropped",
        "the modules the pipeline plan places after the blocks (the final norm) run on every stage",
        "shardcore/plan/shipped.py",
        "shipped_stage_facts",
        [("last_ends=tuple(names[at + 1 :])", "last_ends=()")],
        "tests/test_core_recent_families.py::test_pipeline_from_the_plan_the_config_ships[Qwen3]",
        "pipeline_step loss 4.90475178 vs unsharded 4.89089918",
    ),
    m(
        "shipped-stages-take-any-input",
        "blocks taking an input the pipeline plan names and no stage builds are cut into stages anyway",
        "shardcore/plan/shipped.py",
        "shipped_stage_facts",
        [("    taken = [i for i in plan[container[0]][0] if i not in _BUILT]", "    taken = []")],
        "tests/test_core_recent_families.py::test_a_pipeline_the_shipped_plan_cannot_give_is_refused_by_name"
        "[an-input-no-stage-builds]",
        "not refused as expected; optimize said: no error",
    ),
    m(
        "shipped-stages-handed-on-unseen",
        "a model whose blocks hand a second value on to the next block (GLM-MoE-DSA's indexer choice) cut into "
        "stages: a stage's first block gets none",
        "shardcore/plan/shipped.py",
        "shipped_stage_facts",
        [("    handed = _handed_on(type(base), container[0])", "    handed = []")],
        "tests/test_core_recent_families.py::test_a_pipeline_the_shipped_plan_cannot_give_is_refused_by_name"
        "[a-handed-on-output]",
        "not refused as expected; optimize said: no error",
    ),
    m(
        "shipped-linear-layers-unseen",
        "a linear-attention layer (MiniMax's) whose mixer shardcore does not recognize, split under Ulysses: it "
        "mixes a rank's tokens only",
        "shardcore/plan/mixers.py",
        "token_mixers",
        [("        if recurrent and not seeds:", "        if False:")],
        "tests/test_core_recent_families.py::test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name"
        "[linear-attention-unrecognized-all_to_all]",
        "2 blocks ran but the split attention ran 1 times",
    ),
    m(
        "shipped-convolution-unseen",
        "Falcon-H1's Mamba-2 mixer (a convolution, in a layer whose type says 'hybrid') not gathered under the "
        "ring: it convolves and scans a rank's tokens only",
        "shardcore/plan/mixers.py",
        "token_mixers",
        [("            and (_convolves(m) or (recurrent and", "            and (False or (recurrent and")],
        "tests/test_core_recent_families.py::test_hybrids_and_per_position_scales_under_ulysses_and_the_ring"
        "[FalconH1-ring_attn]",
        # no mixer found, nothing vouches for its attention: transformers' own word (not through the registry) refuses
        "does not run its attention through transformers' attention registry",
    ),
    m(
        "mixer-bare-convolution-gathered",
        "a convolution inside the attention module with nothing around it but the attention taken for a mixer "
        "itself (its input is (batch, channels, sequence))",
        "shardcore/plan/mixers.py",
        "_around",
        [("    return None if best is None or _convolves(modules[best]) else best", "    return best")],
        "tests/test_core_recent_families.py::test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name"
        "[a-bare-convolution-all_to_all]",
        "not refused as expected",
    ),
    m(
        "shipped-rotary-not-split",
        "under Ulysses / the ring the rotary embeddings of the whole sequence meet a rank's part of it",
        "shardcore/plan/shipped.py",
        "ShippedPlanPolicy._along",
        [('        return ("position_embeddings", *dict.fromkeys(', "        return tuple(dict.fromkeys(")],
        "tests/test_core_recent_families.py::test_sequence_parallelism_through_the_attention_registry[Qwen3-ring_attn]",
        "The size of tensor a (8) must match the size of tensor b (16) at non-singleton dimension 2",
    ),
    m(
        "shipped-sinks-not-per-head",
        "GPT-OSS's per-head attention sinks not declared per head: under Ulysses a rank's half of the heads "
        "meets every head's sink",
        "shardcore/plan/shipped.py",
        "ShippedPlanPolicy.sequence",
        [('            per_head=("sinks", "s_aux") if _sinks(self.model) else (),', "            per_head=(),")],
        "tests/test_core_recent_families.py::test_sequence_parallelism_through_the_attention_registry"
        "[GptOss-all_to_all]",
        "Sizes of tensors must match",
    ),
    m(
        "shipped-mask-readers-unseen",
        "a zero-config attention that reads the whole sequence's mask beside a rank's queries (a sparse-attention "
        "indexer: GLM-MoE-DSA's) split all the same",
        "shardcore/plan/shipped.py",
        "ShippedPlanPolicy._not_split",
        [("        readers = [r for r in mask_readers(self.model) if r[:2] not in built]", "        readers = []")],
        "tests/test_core_recent_families.py::test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name"
        "[its-own-use-of-the-mask-all_to_all]",
        "must match the size of tensor",
    ),
    m(
        "shipped-position-inputs-unseen",
        "a zero-config attention that scales its queries by a tensor of positions it takes besides the hidden "
        "states (Ministral 3's position_ids) left whole beside a rank's part of the queries",
        "shardcore/plan/shipped.py",
        "ShippedPlanPolicy._along",
        [("in tensor_inputs(self.model)", "in []")],
        "tests/test_core_recent_families.py::test_hybrids_and_per_position_scales_under_ulysses_and_the_ring"
        "[Ministral3-all_to_all]",
        Raised("RuntimeError", "transformers/models/ministral3/modeling_ministral3.py::forward"),  # the query scale
    ),
    m(
        "shipped-block-inputs-unseen",
        "a block's own input along the sequence (Gemma 4's per_layer_input) left whole while the hidden states are "
        "split: the whole sequence's meets a rank's part",
        "shardcore/plan/shipped.py",
        "ShippedPlanPolicy.sequence",
        [
            (
                "            block_inputs=inputs,",
                "            block_inputs=(),",
            )
        ],
        "tests/test_core_recent_families.py::test_a_blocks_own_input_along_the_sequence_is_cut_with_it[Gemma4-ring_attn]",
        "must match the size of tensor",
    ),
    m(
        "shipped-position-bias-unseen",
        "Inkling's relative position bias, computed over a rank's queries and every head, handed to the attention "
        "function under Ulysses all the same",
        "shardcore/plan/shipped.py",
        "ShippedPlanPolicy._not_split",
        [("        biases = bias_passers(self.model)", "        biases = []")],
        "tests/test_core_recent_families.py::test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name"
        "[a-position-bias-all_to_all]",
        "must match the size of tensor b (8)",  # the bias over a rank's queries against the whole sequence's keys
    ),
    m(
        "region-without-a-pair",
        "split_gather declared for blocks the plan gives no column-/row-parallel pair (GPT-OSS): attention over a "
        "rank's tokens",
        "shardcore/plan/region.py",
        "_block_problem",
        [("    if Linear1D_Col not in inside.values() or Linear1D_Row not in inside.values():", "    if False:")],
        "tests/test_core_recent_families.py::test_split_gather_a_plan_gives_no_region_for_is_refused_by_name[GptOss]",
        "not refused as expected",
    ),
    m(
        "region-norm-in-entry-unchecked",
        "a norm inside a module that gathers the sequence, neither split nor summed by the plan (OLMo-2's q_norm), "
        "taken for a token-wise norm on a rank's tokens",
        "shardcore/plan/region.py",
        "_block_problem",
        [("        if entry is not None and not set(own) <= grad_sum:", "        if False:")],
        "tests/test_core_recent_families.py::test_split_gather_a_plan_gives_no_region_for_is_refused_by_name[Olmo2]",
        "not refused as expected",
    ),
    m(
        "region-columns-gather-again",
        "under split_gather the column-parallel layers inside a module that gathered the sequence gather it again",
        "shardcore/plan/region.py",
        "region_entries",
        [
            (
                '        attrs.evolve(s, kwargs={**s.kwargs, "copy_input": False})',
                "        attrs.evolve(s, kwargs=dict(s.kwargs))",
            )
        ],
        "tests/test_core_recent_families.py::test_split_gather_over_the_region_the_plan_gives[Qwen3]",
        "mat1 and mat2 shapes cannot be multiplied",
    ),
    m(
        "shipped-experts-not-routed",
        "under expert parallelism the experts the expert plan names are left as the TP plan has them: no token "
        "travels, every rank runs every expert",
        "shardcore/plan/shipped.py",
        "ShippedPlanPolicy.module_policy",
        [
            (
                '        routed = [Sub(suffix=d, target_module=ExpertsEP, kwargs={"layout": self.layout}) for d in dispatched]',
                "        routed = []",
            )
        ],
        "tests/test_core_recent_families.py::test_expert_parallelism_from_the_shipped_expert_plan[DeepseekV3-ep2-ddp]",
        "'all_to_all': 0",
    ),
    m(
        "plan-ddp-unused-not-found",
        "DDP over a zero-config model not told that a step may leave parameters without a gradient (DeepSeek-V3.2's "
        "indexer): their bucket never reduced, the gradients beside them each rank's own",
        "shardcore/plan/policy.py",
        "PlanPolicy.data_parallel",
        [(", find_unused=True, ", ", ")],
        "tests/test_core_recent_families.py::test_data_parallel_over_parameters_a_step_leaves_without_gradient[ddp]",
        "(gathered over dp and tp): relative error",
    ),
    m(
        "plan-zero-computation-experts-undeclared",
        "a plan's zero-computation experts (moe_identity_expert) not read as a reason FSDP cannot run the model",
        "shardcore/plan/styles.py",
        "unchosen_experts",
        [('== "moe_identity_expert"', '== "moe_identity_experts"')],
        "tests/test_core_recent_families.py::test_experts_beside_zero_computation_ones_under_data_parallelism",
        "the plan's policy declares no FSDP refusal: ''",
    ),
    m(
        "shipped-other-sequence-input-cut",
        "a block input named as another sequence's states (a cross-attention's encoder_hidden_states) cut as if it "
        "ran along the hidden states' sequence",
        "shardcore/plan/shipped.py",
        "ShippedPlanPolicy._not_split",
        [("for w in _OTHER_SEQUENCE", "for w in ()")],
        "tests/test_core_recent_families.py::test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name[an-encoder-input-all_to_all]",
        "not refused as expected",
    ),
]
