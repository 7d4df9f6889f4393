"""Mutants of shard-llama: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "policy-replaces-nothing",
        "a policy that replaces nothing (Llama's module_policy returns {})",
        "plugins/shard-llama/shard_llama/policy.py",
        "LlamaPolicy.module_policy",
        [
            (
                "        heads, kv, head_dim = self._dims()\n",
                "        return {}\n        heads, kv, head_dim = self._dims()\n",
            )
        ],
        "plugins/shard-llama/tests/test_llama_tp.py::test_causal_lm[2]",
        "hold no parallel module: the policy left them whole",
    ),
    m(
        "smallest-gradient-sign-flip",
        "the sign of the model's smallest gradient flipped (Llama layer 1's post_attention_layernorm)",
        "plugins/shard-llama/shard_llama/policy.py",
        "LlamaPolicy.module_policy",
        [
            (
                '                per_rank_rng=["self_attn"],  # attention dropout drops this rank\'s heads\n',
                '                per_rank_rng=["self_attn"],  # attention dropout drops this rank\'s heads\n                param_replacement=[lambda m: m.post_attention_layernorm.weight.register_hook(lambda g: -g) if m.self_attn.layer_idx == 1 else None],\n',
            )
        ],
        "plugins/shard-llama/tests/test_llama_tp.py::test_causal_lm[2]",
        "gradient of model.layers.1.post_attention_layernorm.weight",
    ),
    m(
        "llama-registers-nothing",
        "shard-llama's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-llama/shard_llama/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "tests/test_core_plugins.py::test_each_bundled_plugin_covers_its_models[llama]",
        "shard-llama's hook left",
    ),
]
