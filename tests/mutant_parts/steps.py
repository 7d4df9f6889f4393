"""Mutants of optimize: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "expert-groups-not-prepared",
        "optimize no longer builds the expert-parallel groups before the layers: an expert layer would have to create them itself",
        "shardcore/steps.py",
        "_shard",
        [("    if b.expert_parallel:  # the expert layers' groups", "    if False:  # the expert layers' groups")],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_each_rank_holds_its_share_of_the_experts[2-2-1]",
        "the expert-parallel groups of layout",
    ),
    m(
        "error-after-collective",
        "the policy's checks moved behind the same-weights all-gather: one rank's error leaves the others waiting",
        "shardcore/steps.py",
        "",
        [
            ("    policy.config_sanity_check()\n", ""),
            (
                "        check_same_weights(b.model, dist.group.WORLD if b.whole_world else _tp_group(b))\n",
                "        check_same_weights(b.model, dist.group.WORLD if b.whole_world else _tp_group(b))\n        b.policy.config_sanity_check()\n",
            ),
        ],
        "tests/test_core_config.py::test_bad_input_fails_on_every_rank_without_hanging",
        "refused only after {'new_group'",
    ),
    m(
        "lora-cut-only-at-forward",
        "adapters peft adds after optimize cut only at the next forward (no registration hook)",
        "shardcore/steps.py",
        "_register",
        [("        watch_adapters(model)\n", "")],
        "tests/integration/test_llama_peft.py::test_merge_and_unload_before_any_forward",
        "_merge_before_forward failed on 2 of 2 ranks",
    ),
    m(
        "accelerate-ddp-overwrites-slices",
        "a sharded model without its DDP ignore list: accelerate's prepare broadcasts rank 0's slices",
        "shardcore/data_parallel/outer.py",
        "set_outer_ddp_ignore",
        [("        model._ddp_params_and_buffers_to_ignore = sorted(split)", "        pass")],
        "tests/integration/test_llama_trainer.py::test_accelerate_prepare_is_right_or_loud",
        "after accelerate's loop: max abs diff",
    ),
    m(
        "outer-ddp-around-shardcores-data-parallel-let-through",
        "a DDP from outside around shardcore's own FSDP / DDP is not refused: it averages twice or breaks",
        "shardcore/data_parallel/outer.py",
        "_refusal",
        [("    if data_parallel is not None:", "    if False:")],
        "tests/test_core_data_parallel.py::test_a_ddp_from_outside_is_refused_by_name_where_it_cannot_be_right[fsdp]",
        Raised(
            "AssertionError",
            "tests/test_core_data_parallel.py::test_a_ddp_from_outside_is_refused_by_name_where_it_cannot_be_right",
        ),
        fast=True,  # data_parallel's fast mutant (19 s; mixed-precision-ignored's check took 34 s of CI)
    ),
    m(
        "outer-ddp-over-replicas-without-data-parallel-let-through",
        "a DDP from outside over dp > 1 replicas without data_parallel: the slices' gradients never averaged",
        "shardcore/data_parallel/outer.py",
        "_refusal",
        [("    if layout.dp > 1:", "    if False:")],
        "tests/test_core_data_parallel.py::test_a_ddp_from_outside_is_refused_by_name_where_it_cannot_be_right[dp-without-data-parallel]",
        Raised(
            "AssertionError",
            "tests/test_core_data_parallel.py::test_a_ddp_from_outside_is_refused_by_name_where_it_cannot_be_right",
        ),
    ),
    m(
        "replica-groups-not-prepared",
        "optimize no longer makes the replica sub-groups before the layers are built",
        "shardcore/steps.py",
        "_shard",
        [("    prepare_replica_groups(b.group, tp_groups)\n", "")],
        "plugins/shard-llama/tests/test_llama_tp.py::test_causal_lm_variants[gqa-4]",
        "are not prepared: call shardcore.distributed.prepare_replica_groups",
    ),
]
