"""The user's own lines on a sharded mixture-of-experts model: clip_grad_norm_, save_pretrained /
from_pretrained, a checkpoint in transformers 5's per-expert layout read shard by shard onto the
meta-built model, greedy generate with a KV cache, explain's counts against a real step."""

from __future__ import annotations

import pytest
import torch
from moe_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import (
    assert_clipping_matches,
    assert_explain_matches,
    assert_generate_matches,
    assert_lazy_load_matches,
    assert_save_pretrained_matches,
    run_on_ranks,
)

TP2 = ShardConfig(tensor_parallel_size=2)


def _fused_experts() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


pytestmark = pytest.mark.skipif(
    not _fused_experts(),
    reason="transformers 4.x: refused by name (test_moe_tp.py::test_transformers_4_refused_by_name)",
)


def _clip(family: str) -> dict:
    return assert_clipping_matches(lambda: build(family), lm_batch(), TP2)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_clip_grad_norm_matches_unsharded(family):
    for report in run_on_ranks(2, _clip, family):
        assert report, report


def _saved(path: str) -> dict:
    return assert_save_pretrained_matches(lambda: build("qwen3_moe", kv=1), lm_batch(), TP2, path)


def test_save_pretrained_then_from_pretrained(tmp_path):
    run_on_ranks(2, _saved, str(tmp_path / "saved"))


def _lazy(family: str, ckpt: str, out: str) -> float:
    return assert_lazy_load_matches(lambda: build(family), lm_batch(), ckpt, TP2, save_to=out)


def _read_bytes(family: str, ckpt: str) -> dict:
    """The checkpoint bytes this rank reads for its experts (positioned reads, counted)."""
    import shardcore
    from shardcore.testing import rows_read

    with shardcore.init_empty():
        model = build(family)
    model = shardcore.optimize(model, TP2)
    with rows_read() as read:  # every piece of a stacked tensor is read by rows
        shardcore.load_checkpoint(model, ckpt)
    experts = [(k, n) for k, n in read if ".experts." in k]
    return {
        "keys": sorted({k.split(".experts.")[1].split(".")[0] for k, _ in experts}),
        "bytes": sum(n for _, n in experts),
    }


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"])
def test_checkpoint_in_per_expert_layout_read_on_shard(family, tmp_path):
    """transformers 5 writes the experts one tensor each and fuses them when loading (its conversion
    mapping says how, and shard-on-read follows it); shard-on-read reads each rank's experts from those pieces only (half the experts' bytes at TP=2) onto the
    meta-built sharded model, equal outputs; save_checkpoint writes the fused tensors (the model's
    names), which from_pretrained reads back to the same model."""
    torch.manual_seed(0)
    build(family).save_pretrained(tmp_path / "ckpt")
    run_on_ranks(2, _lazy, family, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    reads = run_on_ranks(2, _read_bytes, family, str(tmp_path / "ckpt"))
    assert [r["keys"] for r in reads] == [["0", "1"], ["2", "3"]], reads
    per_expert = {"mixtral": 3 * 96 * 64, "qwen2_moe": 3 * 48 * 64, "qwen3_moe": 3 * 48 * 64, "olmoe": 3 * 48 * 64}
    per_expert = per_expert[family] * 4  # fp32
    assert all(r["bytes"] == 2 * 2 * per_expert for r in reads), reads  # 2 layers x 2 experts
    torch.manual_seed(0)
    ref = build(family).eval()
    back = type(ref).from_pretrained(tmp_path / "out").eval()  # what save_checkpoint wrote (fused)
    with torch.no_grad():
        assert torch.allclose(back(**lm_batch()).logits, ref(**lm_batch()).logits, atol=1e-6)


def _generate() -> list:
    import shardcore

    torch.manual_seed(0)
    ref = build("mixtral", output_router_logits=False).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build("mixtral", output_router_logits=False), TP2).eval()
    prompt = lm_batch(pad=True)
    del prompt["labels"]
    kwargs = {"max_new_tokens": 8, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    return assert_generate_matches(ref, model, **prompt, **kwargs).tolist()


def test_generate_matches_unsharded():
    tokens = run_on_ranks(2, _generate)
    assert tokens[0] == tokens[1]


def _explain() -> dict:
    return assert_explain_matches(lambda: build("qwen2_moe"), lm_batch(), TP2)


def test_explain_predicts_a_step():
    """explain's counts (the experts' all-reduce forward, two backward) match a real step, and
    rank 0's bytes are what it holds: half the experts."""
    report = run_on_ranks(2, _explain)[0]
    rows = {r["pattern"]: r for r in report["modules"]}
    experts = rows["model.layers.*.mlp.experts"]
    assert experts["collectives"] == {"forward": ["all_reduce"], "backward": ["all_reduce", "all_reduce"]}
    assert report["collective_bytes_per_step"]["backward"]["all_reduce"] > 0, report["notes"]  # compared by the kit
    assert experts["bytes_per_rank"] == 2 * 2 * (2 * 48 * 64 + 64 * 48) * 4  # 2 layers x 2 of 4 experts, fp32


def _mismatch(ckpt: str) -> str:
    import shardcore

    with shardcore.init_empty():
        model = build("mixtral", intermediate_size=48)
    model = shardcore.optimize(model, TP2)
    with pytest.raises(shardcore.CheckpointError) as err:
        shardcore.load_checkpoint(model, ckpt)
    return str(err.value)


def test_checkpoint_pieces_of_another_shape_refused(tmp_path):
    """Experts of another size in the checkpoint: refused on every rank before any read, naming
    the fused tensor, the shape its pieces stack to and the one the model expects."""
    torch.manual_seed(0)
    build("mixtral").save_pretrained(tmp_path / "ckpt")  # intermediate 96
    for message in run_on_ranks(2, _mismatch, str(tmp_path / "ckpt")):
        assert "tensor 'model.layers.0.mlp.experts.gate_up_proj': its checkpoint pieces" in message, message
        assert "stack to (4, 192, 64), the model expects [4, 96, 64]" in message, message


def _mixtral_base():
    import transformers
    from moe_cases import moe_config

    config = moe_config("mixtral")
    config._attn_implementation = "sdpa"
    return transformers.MixtralModel(config).float()


def _base_from_causal_lm(ckpt: str) -> float:
    return assert_lazy_load_matches(_mixtral_base, {"input_ids": lm_batch()["input_ids"]}, ckpt, TP2)


def test_base_model_reads_the_causal_lm_checkpoint(tmp_path):
    """MixtralModel from a MixtralForCausalLM checkpoint: the pieces and the renamed router found
    under the ``model.`` prefix, as for every other tensor."""
    torch.manual_seed(0)
    base = _mixtral_base()  # the weights the ranks build again (same seed)
    causal_lm = build("mixtral")
    causal_lm.model = base
    causal_lm.save_pretrained(tmp_path / "ckpt")
    run_on_ranks(2, _base_from_causal_lm, str(tmp_path / "ckpt"))


def test_the_expert_layers_old_module_warns_and_is_the_core_s():
    """``shard_moe.experts`` (0.1) moved to ``shardcore.expert_parallel.experts``: it still imports, warned."""
    import importlib
    import warnings

    from shardcore.expert_parallel import experts

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        old = importlib.reload(importlib.import_module("shard_moe.experts"))  # its warning is at import
    warned = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert any("moved to shardcore.expert_parallel.experts" in w for w in warned), (
        f"shard_moe.experts did not warn: {warned}"
    )
    assert old.ExpertsEP is experts.ExpertsEP and old.ExpertsTP is experts.ExpertsTP, (
        "shard_moe.experts' classes are not the core's"
    )
