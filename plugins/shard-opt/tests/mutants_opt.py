"""Mutants of shard-opt: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "opt-region-entry-dropped",
        "OPT's attention not entered into the TP region: q, k, v's input gradient never summed",
        "plugins/shard-opt/shard_opt/policy.py",
        "OPTPolicy.module_policy",
        [
            (
                '                enter_tp_region=["self_attn"],  # q, k, v read one tensor: one backward all-reduce for the three\n',
                "",
            )
        ],
        "plugins/shard-opt/tests/test_opt_tp.py::test_matches_unsharded[causal-tp2]",
        "OPTPolicy: 'self_attn.q_proj' of OPTDecoderLayer is built with copy_input=False",
    ),
    m(
        "opt-registers-nothing",
        "shard-opt's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-opt/shard_opt/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-opt/tests/test_opt_tp.py::test_matches_unsharded[causal-tp2]",
        "covers transformers.models.opt.modeling_opt.OPTForCausalLM",
    ),
]
