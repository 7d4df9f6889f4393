"""Zero-config: HuggingFace models no plugin covers are sharded by the TP plan they ship."""

from __future__ import annotations

import pytest
import torch

from shardcore import ShardConfig
from shardcore.testing import assert_generate_matches, assert_outputs_close, assert_sharded_matches, run_on_ranks

# decoder families without a shardcore plugin, each with a plain colwise/rowwise base_model_tp_plan
FAMILIES = ["Qwen3", "Granite", "Helium", "Cohere", "SmolLM3"]


def build(family: str, *, heads: int = 4, kv: int = 2, tie: bool = False):
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vocab_size=1001,  # not divisible by 2 or 4: padded to 1024, an equal slice per rank
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config._attn_implementation = "sdpa"
    return getattr(transformers, f"{family}ForCausalLM")(config).float()


def batch(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 1001, (2, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3], ids[0, :3] = 0, 0  # left padding, ignored by the loss
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _check(tp: int, family: str, kv: int, tie: bool) -> dict:
    import shardcore

    report = assert_sharded_matches(
        lambda: build(family, kv=kv, tie=tie),
        batch(),
        ShardConfig(tensor_parallel_size=tp),
        max_param_fraction=0.55,  # embeddings and head split too
    )
    torch.manual_seed(0)
    model = shardcore.optimize(build(family, kv=kv, tie=tie), ShardConfig(tensor_parallel_size=tp))
    kinds = {type(model.get_input_embeddings()).__name__, type(model.get_output_embeddings()).__name__}
    return {"policy": type(model.shardcore.policy).__name__, "ends": sorted(kinds), "report": report}


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_config_tp2(family):
    """No plugin: the model's base_model_tp_plan, with shardcore's layers (vocab-parallel ends):
    logits, loss, every gradient and AdamW steps equal to unsharded; at most 0.55 of the bytes."""
    tie = family == "Cohere"  # its default: a tied head, split like the embedding
    for result in run_on_ranks(2, _check, 2, family, 2, tie):
        assert result["policy"] == "ShippedPlanPolicy"
        assert result["ends"] == ["VocabParallelEmbedding1D", "VocabParallelLMHead1D"]


def test_zero_config_fewer_kv_heads_than_ranks():
    """Granite with 2 KV heads on 4 ranks: each KV head replicated on 2 ranks (transformers' own
    TP cannot split 2 heads 4 ways)."""
    run_on_ranks(4, _check, 4, "Granite", 2, False)


def _generate(tp: int) -> list:
    import shardcore

    torch.manual_seed(0)
    ref = build("Qwen3").eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build("Qwen3").eval(), ShardConfig(tensor_parallel_size=tp))
    b = batch(seed=3)
    tokens = assert_generate_matches(
        ref,
        model,
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
    )
    return tokens.tolist()


def test_zero_config_generate():
    """Greedy generation with the KV cache, Qwen3 (per-head q/k norms, their gradients summed)."""
    run_on_ranks(2, _generate, 2)


def _which(family: str) -> str:
    import shardcore

    model = build(family)
    return type(shardcore.resolve_policy(model)).__name__


def test_plugins_win_over_the_fallback():
    import transformers

    assert transformers.LlamaConfig.base_model_tp_plan  # Llama ships a plan too ...
    assert _which("Llama") == "LlamaForCausalLMPolicy"  # ... but shard-llama covers it
    assert _which("Qwen3") == "ShippedPlanPolicy"


def test_unsupported_tp_style_is_named():
    """A shipped plan with a style zero-config does not translate (one transformers may add later,
    or sequence_parallel): an error naming it, the styles it does translate, and the way out."""
    import transformers

    from shardcore.plan import PlanError, hf_tp_plan

    config = transformers.Olmo2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = transformers.Olmo2ForCausalLM(config)
    model.config.base_model_tp_plan = {**config.base_model_tp_plan, "norm": "sequence_parallel"}
    with pytest.raises(PlanError, match="'sequence_parallel', which shardcore's zero-config does not translate"):
        hf_tp_plan(model)


def _from_yaml(tp: int, path: str) -> dict:
    return assert_sharded_matches(lambda: build("Qwen3"), batch(), ShardConfig(tensor_parallel_size=tp, plan=path))


def test_shardcore_plan_writes_a_plan_that_round_trips(tmp_path):
    """`shardcore plan MODEL --out FILE` writes the derived plan as YAML (per-head norms marked
    replicated_with_grad_allreduce); passed back as ShardConfig(plan=FILE) it gives the unsharded
    outputs and gradients again, the norms' gradients included."""
    import subprocess
    import sys

    path = tmp_path / "qwen3.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "shardcore", "plan", "transformers:Qwen3ForCausalLM", "--out", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    text = path.read_text()
    assert "model.layers.*.self_attn.q_norm.weight: replicated_with_grad_allreduce" in text.replace("  ", "")
    assert "lm_head.weight:" in text and "model.embed_tokens.weight:" in text
    run_on_ranks(2, _from_yaml, 2, str(path))


def _explain(tp: int) -> dict:
    from shardcore.testing import assert_explain_matches

    return assert_explain_matches(lambda: build("Qwen3"), batch(), ShardConfig(tensor_parallel_size=tp))


def test_explain_predicts_a_zero_config_step():
    """explain of a zero-config model predicts its real step: q/k/v and gate/up share one backward
    all-reduce each, and the per-head norms' gradient sums add one per norm."""
    (report, _) = run_on_ranks(2, _explain, 2)
    assert report["policy"] == "ShippedPlanPolicy"
    assert report["collectives_per_layer"]["Qwen3DecoderLayer"] == {
        "forward": {"all_reduce": 2},
        "backward": {"all_reduce": 4},
    }


def test_parallelize_a_zero_config_model():
    """One call from a plain process: the workers shard the model by its shipped plan."""
    import shardcore

    torch.manual_seed(0)
    model = build("Qwen3").eval()
    b = batch()
    inputs = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
    with torch.no_grad():
        expected = model(**inputs).logits
    with shardcore.parallelize(model, 2) as handle:
        logits = handle(**inputs).logits
    real = b["attention_mask"].bool()
    assert_outputs_close(logits[real], expected[real], "zero-config logits through parallelize")


def _clip(tp: int) -> dict:
    from shardcore.testing import assert_clipping_matches

    return assert_clipping_matches(
        lambda: build("Qwen3", kv=2, tie=True), batch(), ShardConfig(tensor_parallel_size=tp)
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_zero_config_clip_grad_norm(tp):
    # torch.nn.utils.clip_grad_norm_ on a zero-config model: the unsharded norm and clipped gradients
    for report in run_on_ranks(tp, _clip, tp):
        assert report["norm_rel_diff"] <= 1e-5


def _save(tp: int, path: str) -> dict:
    from shardcore.testing import assert_save_pretrained_matches

    return assert_save_pretrained_matches(
        lambda: build("Qwen3", kv=2, tie=True), batch(), ShardConfig(tensor_parallel_size=tp), path
    )


def test_zero_config_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))
