"""Mutants of shard-moe: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "moe-k-norm-gradient-partial",
        "Qwen3-MoE's replicated k_norm (applied to each rank's heads) keeps its rank's partial gradient",
        "plugins/shard-moe/shard_moe/policy.py",
        "MoePolicy.tensor_parallel",
        [
            (
                '        norms = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")',
                '        norms = ("self_attn.q_norm.weight",)',
            )
        ],
        "plugins/shard-moe/tests/test_moe_tp.py::test_matches_unsharded[qwen3-moe-tp2-kv1]",
        "gradient of model.layers.0.self_attn.k_norm.weight (gathered): relative error",
    ),
    m(
        "moe-balance-loss-not-added",
        "global_batch_balance computes the whole batch's balance loss but never puts it into the model's loss",
        "plugins/shard-moe/shard_moe/balance.py",
        "over_global_batch.whole_batch",
        [
            (
                "            output.loss = output.loss + mod.router_aux_loss_coef * (whole - local).to(output.loss.device)",
                "            pass",
            )
        ],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2-global-balance]",
        "mean loss over the data-parallel ranks 4.927",
    ),
    m(
        "moe-registers-nothing",
        "shard-moe's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-moe/shard_moe/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "tests/test_core_plugins.py::test_each_bundled_plugin_covers_its_models[moe]",
        "shard-moe's hook left",
    ),
]
