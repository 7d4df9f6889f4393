"""The family sweep's fast subset (``benchmarks/families.py``; the whole sweep is ``nox -s families``):
families through zero-config, each style transformers ships among them, and some plugins' families,
at TP=2 on tiny configs against the unsharded model. A transformers release that breaks one fails here."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from shardcore.testing import run_on_ranks

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "families.py"
_spec = importlib.util.spec_from_file_location("families", _PATH)
families = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(families)

#: (model type, task, model class, through zero-config even where a plugin covers it): what it shows
EXACT = [
    ("gpt_neox", "causal-lm", "GPTNeoXForCausalLM", False),  # embedding_rowwise (the 5.24 regression)
    ("phi3", "causal-lm", "Phi3ForCausalLM", False),  # colwise_gather_output / rowwise_split_input
    ("olmo2", "causal-lm", "Olmo2ForCausalLM", False),  # q/k norms over the gathered width
    ("glm4", "causal-lm", "Glm4ForCausalLM", True),  # gathered fused gate_up (shard-glm covers it too)
    ("deepseek_v3", "causal-lm", "DeepseekV3ForCausalLM", False),  # mla_kv_a_proj, moe_tp_experts, packed_colwise
    ("llama4_text", "causal-lm", "Llama4ForCausalLM", False),  # packed_rowwise experts, colwise 3-D down_proj
    ("apertus", "causal-lm", "ApertusForCausalLM", False),  # alpha_p/alpha_n found and summed by the block check
    ("qwen2_vl", "vision-language", "Qwen2VLForConditionalGeneration", False),  # a plan inside text_config
    ("qwen3_moe", "causal-lm", "Qwen3MoeForCausalLM", True),  # fused experts, per-head norms
    ("codegen", "causal-lm", "CodeGenForCausalLM", False),  # embedding_rowwise
    ("llama", "causal-lm", "LlamaForCausalLM", False),  # a plugin's family (shard-llama)
    ("gpt2", "causal-lm", "GPT2LMHeadModel", False),  # a plugin's family (shard-gpt2)
    ("t5", "seq2seq", "T5ForConditionalGeneration", False),  # a plugin's family (shard-t5)
]


@pytest.mark.parametrize("family", EXACT, ids=[f[0] for f in EXACT])
def test_family_exact(family):
    model_type, task, name, zero_config = family
    for result in run_on_ranks(2, families.one_family, model_type, task, name, zero_config=zero_config):
        why = result.get("reason") or result.get("wrong_grads") or result.get("worst")
        assert result["outcome"] == "exact", f"{model_type}: {result['outcome']}: {why}"
        zero = zero_config or model_type not in ("llama", "gpt2", "t5")
        assert (result["policy"] == "ShippedPlanPolicy") == zero, result["policy"]


@pytest.mark.parametrize("family", [("mpt", "MptForCausalLM"), ("xglm", "XGLMForCausalLM")], ids=["mpt", "xglm"])
def test_family_derived_plan_exact(family):
    """Families with neither a plugin nor a shipped plan, sharded by ShardConfig(plan="derive")."""
    model_type, name = family
    for result in run_on_ranks(2, families.one_family, model_type, "causal-lm", name, derive=True):
        assert result["derived"] and result["outcome"] == "exact", result


def _moe_save(tp: int, path: str) -> dict:
    import transformers

    from shardcore import ShardConfig
    from shardcore.testing import assert_save_pretrained_matches

    config = families.tiny_config("deepseek_v3")

    def build():
        return transformers.DeepseekV3ForCausalLM(config).float()

    batch = families._inputs("causal-lm", config)
    return assert_save_pretrained_matches(build, batch, ShardConfig(tensor_parallel_size=tp), path)


def test_zero_config_moe_save_pretrained_loads_unsharded(tmp_path):
    """DeepSeek-V3 through zero-config: the fused experts cut in place (packed gate/up, down by its
    input) are gathered into save_pretrained's files, which from_pretrained loads unsharded."""
    for report in run_on_ranks(2, _moe_save, 2, str(tmp_path / "ckpt")):
        assert report["tensors"] > 0


def test_expert_parallel_over_a_shipped_plan_without_an_expert_plan_is_refused_saying_why():
    """expert_parallel_size on a zero-config MoE whose config ships no base_model_ep_plan (Llama-4): the check
    optimize runs before any collective says the plan's experts are split by tensor parallelism. DeepSeek-V3,
    whose config ships one, passes the same check (its expert parallelism: test_core_recent_families.py)."""
    import types

    import transformers

    from shardcore import ShardConfig
    from shardcore.expert_parallel import check_expert_parallel
    from shardcore.plan import zero_config_policy

    config = ShardConfig(tensor_parallel_size=2, data_parallel="ddp", expert_parallel_size=2)
    layout = types.SimpleNamespace(ep=2, pp=1, sp=1)
    model = transformers.Llama4ForCausalLM(families.tiny_config("llama4_text"))
    policy = zero_config_policy(model)
    policy.set_model(model)
    with pytest.raises(
        NotImplementedError, match=r"\(moe_tp_experts\) only: Llama4TextConfig ships no base_model_ep_plan naming"
    ):
        check_expert_parallel(model, policy, config, layout)
    model = transformers.DeepseekV3ForCausalLM(families.tiny_config("deepseek_v3"))
    policy = zero_config_policy(model)
    policy.set_model(model)
    check_expert_parallel(model, policy, config, layout)
