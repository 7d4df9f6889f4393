"""Mutants of expert_parallel: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "moe-expert-shares-not-summed",
        "shard-moe: each rank returns its own experts' share of the tokens (the all-reduce dropped)",
        "shardcore/expert_parallel/experts.py",
        "ExpertsTP.forward",
        [("        return reduce_from_tp(out, group)", "        return out")],
        "plugins/shard-moe/tests/test_moe_tp.py::test_matches_unsharded[mixtral-tp2]",
        "max abs diff",
    ),
    m(
        "moe-router-gradient-partial",
        "shard-moe: the routing weights' gradient left at this rank's experts' share (router trains apart)",
        "shardcore/expert_parallel/experts.py",
        "ExpertsTP.forward",
        [("torch.where(mine, copy_to_tp(top_k_weights, group), 0.0)", "torch.where(mine, top_k_weights, 0.0)")],
        "plugins/shard-moe/tests/test_moe_tp.py::test_matches_unsharded[mixtral-tp2]",
        "gradient of model.",
    ),
    m(
        "ep-token-returned-to-wrong-row",
        "expert parallelism: the experts' outputs come back to the rows in send order, not the tokens' order",
        "shardcore/expert_parallel/__init__.py",
        "route.back",
        [
            (
                "        return whole.index_copy(0, sent, returned)",
                "        return whole.index_copy(0, sent.sort().values, returned)",
            )
        ],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2]",
        "mean loss over the data-parallel ranks",
    ),
    m(
        "ep-expert-gradient-not-averaged",
        "expert parallelism: an expert's gradient left as the sum over the ranks' losses (not divided by dp)",
        "shardcore/expert_parallel/__init__.py",
        "install.average",
        [("        grad = grad / dp\n", "        grad = grad\n")],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2]",
        "gradient of model.layers.0.mlp.experts.",
    ),
    m(
        "ep-expert-replicas-not-summed",
        "expert parallelism: an expert's gradient not summed over the ranks holding the same experts",
        "shardcore/expert_parallel/__init__.py",
        "install.average",
        [
            (
                '        return all_reduce(grad, replicas, where="backward of the experts (gradient summed over their replicas)")',
                "        return grad",
            )
        ],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2-dp4]",
        "gradient of model.layers.0.mlp.experts.",
    ),
    m(
        "ep-global-balance-one-rank",
        "global-batch balancing: the load-balancing loss from this rank's router statistics only",
        "shardcore/expert_parallel/__init__.py",
        "gather_over.gather",
        [("        return _GatherOver.apply(t, group) if group_size(group) > 1 else t", "        return t")],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2-global-balance]",
        "mean loss over the data-parallel ranks",
    ),
    m(
        "ep-global-balance-gradient-not-summed",
        "global-batch balancing: each rank's rows get only its own copy of the loss's gradient (the backward's sum dropped)",
        "shardcore/expert_parallel/__init__.py",
        "_GatherOver.backward",
        [
            (
                "        return reduce_scatter_cat(grad.contiguous(), ctx.group, 0, where=ctx.back), None",
                "        return grad.chunk(group_size(ctx.group))[torch.distributed.get_rank(ctx.group)], None",
            )
        ],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2-global-balance]",
        "gradient of model.",
        fast=True,
    ),
    m(
        "experts-split-without-biases",
        "only the experts' gate_up_proj and down_proj taken over to the expert ranks: GPT-OSS's per-expert biases "
        "are lost",
        "shardcore/expert_parallel/experts.py",
        "_take",
        [
            (
                "    for name, full in list(module.named_parameters(recurse=False)):",
                '    for name, full in [(n, getattr(module, n)) for n in ("gate_up_proj", "down_proj")]:',
            )
        ],
        "tests/test_core_recent_families.py::test_expert_parallelism_from_the_shipped_expert_plan[GptOss-ep2-ddp]",
        "parameter names differ from the unsharded model's: missing ['model.layers.0.mlp.experts.down_proj_bias'",
    ),
    m(
        "experts-zero-gradients-of-named-weights",
        "the zero gradient a rank none of whose experts was chosen keeps, taken of gate_up_proj and down_proj by "
        "name: an experts module with an up projection and no gate (Nemotron-H's) fails",
        "shardcore/expert_parallel/experts.py",
        "ExpertsEP.forward",
        [("self.parameters(recurse=False)", "(self.gate_up_proj, self.down_proj)")],
        "tests/test_core_recent_families.py::test_expert_parallelism_from_the_shipped_expert_plan[NemotronHMoe-ep2-ddp]",
        "object has no attribute 'gate_up_proj'",
    ),
    m(
        "route-counts-on-a-simulated-rank",
        "a simulated rank (no data) counts its tokens' choices per expert to size the all-to-all: FakeTensorMode "
        "cannot give bincount a shape, and explain's tracked memory of an expert-parallel layout fails",
        "shardcore/expert_parallel/__init__.py",
        "_simulated",
        [("    return is_fake(t)", "    return False")],
        "tests/test_core_tracked_memory.py::test_a_simulated_rank_holds_what_explain_predicts_for_it[mixtral-ep2-fsdp2]",
        "DynamicOutputShapeException: aten.bincount.default",
    ),
    m(
        "ep-expert-dispatched-to-wrong-rank",
        "expert parallelism: a token's choice sent to the next expert rank, whose expert of the same local index "
        "computes it",
        "shardcore/expert_parallel/experts.py",
        "ExpertsEP.forward",
        [("ep_rank * per + top_k_index", "(ep_rank + 1) % group_size(self.ep_group) * per + top_k_index")],
        "tests/test_core_recent_families.py::test_expert_parallelism_from_the_shipped_expert_plan[GptOss-ep2-ddp]",
        "mean loss over the data-parallel ranks",
    ),
]
