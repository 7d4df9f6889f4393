"""Mutants of verify: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "block-check-disabled",
        "the block check at optimize compares nothing (BlockProbe.compare returns at once)",
        "shardcore/verify/probe.py",
        "BlockProbe.compare",
        [
            (
                "        problems: list[str] = []\n        summed: list[str] = []\n",
                "        return []\n        problems: list[str] = []\n        summed: list[str] = []\n",
            )
        ],
        "tests/test_core_verify.py::test_a_plan_that_changes_the_output_is_refused_at_optimize",
        "the block check let a wrong plan through",
    ),
    m(
        "raise-not-located",
        "a block that raises once sharded is refused without naming the module that raised",
        "shardcore/verify/locate.py",
        "where_raised",
        [("    found = trace.raised_in()\n", "    found = None\n")],
        "tests/test_core_own_model.py::test_a_norm_over_the_split_width_is_refused_at_optimize_by_name[inputs-found]",
        Raised(
            "AssertionError",
            "tests/test_core_own_model.py::test_a_norm_over_the_split_width_is_refused_at_optimize_by_name",
        ),
    ),
    m(
        "found-partial-gradients-not-summed",
        "the replicated parameters the block check finds partial are named but never summed",
        "shardcore/verify/probe.py",
        "sum_found",
        [("                sum_gradients_over_group({names[-1]: param}, group)\n", "                pass\n")],
        "tests/test_core_verify.py::test_replicated_parameter_on_split_activations_gets_its_gradient_summed[2]",
        "a partial gradient left unsummed",
    ),
    m(
        "first-step-check-disabled",
        "the first-backward gradient check never armed (check_first_backward returns at once)",
        "shardcore/verify/first_step.py",
        "check_first_backward",
        [("    split = set(parameter_specs(model))\n", "    return\n    split = set(parameter_specs(model))\n")],
        "tests/test_core_verify.py::test_the_first_backward_check_names_partial_gradients",
        "the first-step check let partial gradients through",
        fast=True,
    ),
    m(
        "zero-config-not-verified",
        "a plan shardcore did not write (zero-config, YAML) is not checked at optimize or at the first step",
        "shardcore/verify/__init__.py",
        "verifying",
        [("    return config.verify is True or isinstance(policy, PlanPolicy)", "    return config.verify is True")],
        "tests/test_core_verify.py::test_replicated_parameter_on_split_activations_gets_its_gradient_summed[2]",
        "a partial gradient left unsummed: {'embed.weight'",
    ),
    m(
        "probe-counts-routed-tokens-once",
        "the block check compares an expert-parallel parameter's gradient as if its experts saw each probe token "
        "once: every rank sent the same tokens, so a right EP x TP layout is refused",
        "shardcore/verify/probe.py",
        "_routed_copies",
        [("    return 1 if group is None else group_size(group)", "    return 1")],
        "tests/test_core_recent_families.py::test_expert_parallelism_from_the_shipped_expert_plan[DeepseekV3-ep2-tp2]",
        "the gradients of mlp.experts.gate_up_proj (1), mlp.experts.down_proj (1) differ",
    ),
]
