"""Mutants of shard-gpt2: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "residual-dropout-per-rank",
        "GPT-2's residual dropout inside attention left on the per-rank stream (shared_rng dropped)",
        "plugins/shard-gpt2/shard_gpt2/policy.py",
        "GPT2Policy.module_policy",
        [('shared_rng=["attn.resid_dropout"],', "shared_rng=[],")],
        "plugins/shard-gpt2/tests/test_gpt2_tp.py::test_dropout_keeps_replicas_in_step",
        "the replicated hidden states differ between ranks",
    ),
    m(
        "gpt2-registers-nothing",
        "shard-gpt2's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-gpt2/shard_gpt2/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-gpt2/tests/test_gpt2_tp.py::test_matches_unsharded[GPT2LMHeadModel-2]",
        "covers transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel",
    ),
]
