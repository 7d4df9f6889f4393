"""A YAML sharding plan reproducing shard-llama's layout, and the plan's errors."""

from __future__ import annotations

import pathlib

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.distributed.collectives import count_collectives
from shardcore.testing import assert_sharded_matches, refusal_message, run_on_ranks

#: shard-llama's layout as a plan: the file docs/plans.md shows
LLAMA_PLAN = (pathlib.Path(__file__).resolve().parents[2] / "examples" / "llama-tp.yaml").read_text()


def _write(tmp: str, text: str) -> str:
    import pathlib

    path = pathlib.Path(tmp) / "plan.yaml"
    path.write_text(text)
    return str(path)


def _steps(config: ShardConfig, kv: int) -> dict:
    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", kv=kv), config)
    batch = lm_batch()
    with count_collectives() as first:  # the first step: the input check, and a plan's gradient check
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    with count_collectives() as fwd:
        out = model(**batch)
    with count_collectives() as bwd:
        out.loss.backward()
    kinds = {n: type(m).__name__ for n, m in model.named_modules() if "layers.0." in n or "." not in n}
    first.subtract(fwd + bwd)  # what the first step issued beyond a steady one
    return {"counts": (dict(fwd), dict(bwd)), "first": +first, "logits": out.logits.detach(), "kinds": kinds}


def _plan_vs_plugin(tp: int, kv: int, path: str) -> dict:
    plan = ShardConfig(tensor_parallel_size=tp, plan=path)
    report = assert_sharded_matches(lambda: build("LlamaForCausalLM", kv=kv), lm_batch(), plan)
    by_plan, by_plugin = _steps(plan, kv), _steps(ShardConfig(tensor_parallel_size=tp), kv)
    torch.testing.assert_close(by_plan["logits"], by_plugin["logits"], rtol=0, atol=0)
    return {"report": report, "plan": by_plan, "plugin": by_plugin}


@pytest.mark.parametrize(("tp", "kv"), [(2, 2), (4, 2)], ids=["tp2-gqa", "tp4-replicated-kv"])
def test_yaml_plan_reproduces_the_plugin(tmp_path, tp, kv):
    """The plan: outputs, loss, every gradient and 3 AdamW steps equal to unsharded; logits
    bit-identical to the plugin path; the same layers and the same collectives, forward and
    backward (q/k/v and gate/up share one backward all-reduce, as the plugin's regions do; the
    loss on the vocabulary slices while the logits are gathered, as the plugin's); the plan's first
    step alone adds one all-gather, the check of its replicated gradients (ShardConfig.verify)."""
    path = _write(tmp_path, LLAMA_PLAN)
    for result in run_on_ranks(tp, _plan_vs_plugin, tp, kv, path):
        assert result["plan"]["counts"] == result["plugin"]["counts"]
        assert result["plan"]["kinds"] == result["plugin"]["kinds"]
        # both first steps check the inputs (one all-gather); the plan's checks its replicated gradients too
        assert result["plan"]["first"] - result["plugin"]["first"] == {"all_gather": 1}


def _refusal(text: str, tmp: str, intermediate: int) -> str:
    path = _write(tmp, text)
    return refusal_message(
        lambda: build("LlamaForCausalLM", kv=2, intermediate=intermediate),
        ShardConfig(tensor_parallel_size=2, plan=path),
    )


BAD = {
    "unmatched key": (
        LLAMA_PLAN + "model.layers.*.mlp.gate_prj.weight: [tp, null]\n",
        "plan.yaml:13: 'model.layers.*.mlp.gate_prj.weight' matches no parameter or module of LlamaForCausalLM; "
        "did you mean 'model.layers.*.mlp.gate_proj.weight'?",
    ),
    "non-dividing axis": (  # built with intermediate_size=129
        LLAMA_PLAN,
        "plan.yaml:7: model.layers.0.mlp.gate_proj.weight dim 0 has size 129, not divisible by tp=2",
    ),
    "unknown axis": (
        LLAMA_PLAN.replace("o_proj.weight: [null, tp]", "o_proj.weight: [null, tensor]"),
        "plan.yaml:6: 'model.layers.*.self_attn.o_proj.weight': unknown mesh axis 'tensor'",
    ),
    "malformed yaml": (
        LLAMA_PLAN.replace("lm_head.weight: [tp, null]", "lm_head.weight: [tp, null"),
        "plan.yaml:13: malformed YAML",
    ),
    "wrong activation spec": (
        LLAMA_PLAN + "model.layers.*.mlp.gate_proj: [null, null, null]\n",
        "'model.layers.*.mlp.gate_proj': model.layers.0.mlp.gate_proj's output is split over tp on its last dimension",
    ),
    "dp axis without fsdp": (
        LLAMA_PLAN.replace("up_proj.weight: [tp, null]", "up_proj.weight: [tp, dp]"),
        "plan.yaml:8: 'model.layers.*.mlp.up_proj.weight': the axis 'dp' splits parameters over the data-parallel "
        "ranks, which FSDP does: set ShardConfig(data_parallel='fsdp')",
    ),
    "embedding width": (
        LLAMA_PLAN.replace("model.embed_tokens.weight: [tp, null]", "model.embed_tokens.weight: [null, tp]"),
        "shardcore splits embeddings over the vocabulary",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_plans_are_refused_early_on_every_rank(tmp_path, case):
    """Each mistake: a clear error naming the file, line and key, on every rank, before any collective."""
    text, expected = BAD[case]
    intermediate = 129 if case == "non-dividing axis" else 128
    for message in run_on_ranks(2, _refusal, text, str(tmp_path), intermediate):
        assert expected in message, f"{case}: refused with {message!r}"


def _with_policy(tmp: str) -> str:
    from shard_llama.policy import LlamaForCausalLMPolicy

    path = _write(tmp, LLAMA_PLAN)
    return refusal_message(
        lambda: build("LlamaForCausalLM"), ShardConfig(tensor_parallel_size=2, plan=path), policy=LlamaForCausalLMPolicy
    )


def test_plan_and_policy_conflict(tmp_path):
    for message in run_on_ranks(2, _with_policy, str(tmp_path)):
        assert "ShardConfig(plan=...) and policy=... both say how to shard the model" in message


# FSDP on the plan's dp axis: q_proj split over tp on dim 0 and over dp on dim 1; the rest along dim 0
DP_PLAN = LLAMA_PLAN.replace("q_proj.weight: [tp, null]", "q_proj.weight: [tp, dp]") + "model.norm.weight: [dp]\n"


def _fsdp_plan(path: str) -> dict:
    import shardcore
    from shardcore.testing import assert_data_parallel_matches

    config = ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="fsdp", plan=path)
    report = assert_data_parallel_matches(lambda: build("LlamaForCausalLM", kv=2), lm_batch(batch=4, pad=False), config)
    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", kv=2), config)
    report["placements"] = {n: str(p.placements) for n, p in model.named_parameters() if "layers.0.self_attn" in n}
    return report


def test_plan_dp_axis_picks_the_fsdp_dimension(tmp_path):
    path = _write(tmp_path, DP_PLAN)
    for report in run_on_ranks(4, _fsdp_plan, path):
        assert report["placements"]["model.layers.0.self_attn.q_proj.weight"] == "(Shard(dim=1),)", report
        assert report["placements"]["model.layers.0.self_attn.k_proj.weight"] == "(Shard(dim=0),)", report
        assert abs(report["state_fraction"] - 0.25) <= 0.01, report


def _plan_parallel_output(tp: int, path: str) -> dict:
    from llama_cases import gather_vocab_logits

    from shardcore.tensor_parallel import VocabSlice

    config = ShardConfig(tensor_parallel_size=tp, plan=path, parallel_output=True)
    report = assert_sharded_matches(
        lambda: build("LlamaForCausalLM"), lm_batch(), config, sharded_output_fn=gather_vocab_logits
    )
    torch.manual_seed(0)
    import shardcore

    model = shardcore.optimize(build("LlamaForCausalLM"), config)
    return {"report": report, "marked": isinstance(model(**lm_batch()).logits, VocabSlice)}


@pytest.mark.parametrize("tp", [2, 4])
def test_yaml_plan_with_parallel_output(tmp_path, tp):
    """parallel_output=True through a plan: the causal LM's own loss on the vocabulary slices (its
    loss_function), the unsharded loss and gradients; the logits each rank's slice, marked."""
    path = _write(tmp_path, LLAMA_PLAN)
    for result in run_on_ranks(tp, _plan_parallel_output, tp, path):
        assert result["marked"], result
