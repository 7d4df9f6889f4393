"""Sharded mixture-of-experts models against the unsharded model, on real gloo ranks (the kit
does the checking: outputs, the loss with the load-balancing loss in it, every gradient gathered
and per rank, three AdamW steps)."""

from __future__ import annotations

import pytest
import torch
from moe_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, refusal_message, run_on_ranks


def _fused_experts() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


def _refused_on_v4(tp: int) -> str:
    return refusal_message(lambda: build("mixtral"), ShardConfig(tensor_parallel_size=tp))


def test_transformers_4_refused_by_name():
    """transformers 4.x keeps one module per expert: refused, naming the version, before any collective."""
    if _fused_experts():
        pytest.skip("transformers 5: the fused experts are sharded (test_matches_unsharded)")
    for message in run_on_ranks(2, _refused_on_v4, 2):
        assert "shard-moe shards the fused expert weights of transformers 5" in message, message


def _check(tp: int, family: str, cfg: dict) -> dict:
    from shardcore.tensor_parallel import count_collectives

    with count_collectives() as counts:
        report = assert_sharded_matches(lambda: build(family, **cfg), lm_batch(), ShardConfig(tensor_parallel_size=tp))
    report["counts"] = dict(counts)
    torch.manual_seed(0)  # the kit's model (its seed)
    with torch.no_grad():  # which experts the unsharded router picks for this batch, per layer
        out = build(family, **cfg)(**lm_batch())
    k = cfg.get("top_k", 2)
    report["experts_hit"] = [len(set(r.topk(k, dim=-1).indices.flatten().tolist())) for r in out.router_logits]
    report["aux_loss"] = float(out.aux_loss)
    return report


@pytest.mark.parametrize(
    ("family", "tp", "cfg"),
    [
        ("mixtral", 2, {}),
        ("mixtral", 4, {"experts": 8, "heads": 8, "kv": 4}),
        ("qwen2_moe", 2, {}),
        ("qwen3_moe", 2, {"kv": 1}),  # one key/value head, replicated on both ranks
        ("olmoe", 2, {}),  # q_norm / k_norm over every head: split with them
        ("olmoe", 4, {"heads": 8, "kv": 4, "experts": 8}),
        ("mixtral", 2, {"experts": 8, "top_k": 1}),  # 8 experts for 24 tokens: some get none
    ],
    ids=[
        "mixtral-tp2",
        "mixtral-tp4",
        "qwen2-moe-tp2",
        "qwen3-moe-tp2-kv1",
        "olmoe-tp2",
        "olmoe-tp4",
        "mixtral-top1-uneven",
    ],
)
def test_matches_unsharded(family, tp, cfg):
    if not _fused_experts():
        pytest.skip("transformers 4.x: refused by name (test_transformers_4_refused_by_name)")
    experts = cfg.get("experts", 4)
    for report in run_on_ranks(tp, _check, tp, family, cfg):
        assert "max_abs_diff_after_steps" in report, report
        assert report["counts"]["all_reduce"] > 0 and report["aux_loss"] > 0, report
        if cfg.get("top_k") == 1:  # the uneven case: in some layer, some expert gets no token
            assert min(report["experts_hit"]) < experts, report["experts_hit"]


def _holds(tp: int) -> dict:
    import shardcore

    model = shardcore.optimize(build("mixtral", experts=4), ShardConfig(tensor_parallel_size=tp))
    experts = model.model.layers[0].mlp.experts
    return {"gate_up": tuple(experts.gate_up_proj.shape), "down": tuple(experts.down_proj.shape), "repr": repr(experts)}


def test_each_rank_holds_its_experts_only():
    if not _fused_experts():
        pytest.skip("transformers 4.x: refused by name (test_transformers_4_refused_by_name)")
    reports = run_on_ranks(2, _holds, 2)
    assert [r["gate_up"] for r in reports] == [(2, 192, 64)] * 2 and reports[0]["down"] == (2, 64, 96)
    assert "experts 0..1 of 4" in reports[0]["repr"] and "experts 2..3 of 4" in reports[1]["repr"]


def _refused(tp: int, cfg: dict) -> str:
    return refusal_message(lambda: build("mixtral", **cfg), ShardConfig(tensor_parallel_size=tp))


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        ({"experts": 3, "heads": 4, "kv": 4}, "num_experts=3 is not divisible by tensor_parallel_size=2"),
        ({"router_jitter_noise": 0.1}, "router_jitter_noise=0.1 draws the router's noise per rank"),
    ],
    ids=["experts", "jitter"],
)
def test_refused_on_every_rank_before_any_collective(cfg, expected):
    if not _fused_experts():
        pytest.skip("transformers 4.x: refused by name (test_transformers_4_refused_by_name)")
    for message in run_on_ranks(2, _refused, 2, cfg):
        assert expected in message, message


def _layout_refused(config: dict) -> str:
    return refusal_message(lambda: build("mixtral"), ShardConfig(**config))


ROUTER_LOSS = "output_router_logits=True adds the router's load-balancing loss over every layer's and every token's"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"tensor_parallel_size": 1, "pipeline_parallel_size": 2}, ROUTER_LOSS),
        ({"tensor_parallel_size": 2, "enable_sequence_parallelism": True}, ROUTER_LOSS),
        (
            {
                "sequence_parallel_size": 2,
                "enable_sequence_parallelism": True,
                "sequence_parallelism_mode": "ring_attn",
            },
            ROUTER_LOSS,
        ),
    ],
    ids=["pipeline", "split_gather", "ring"],
)
def test_the_router_loss_refuses_stages_and_sequence_splits_by_name(config, expected):
    """With ``output_router_logits=True`` (the cases' default) a stage sees its layers only and a split
    rank its tokens only: refused on every rank before any collective. Without it they run
    (``nox -s matrix``, the mixtral, qwen2_moe and olmoe rows; tests/test_core_matrix.py's Mixtral PP)."""
    if not _fused_experts():
        pytest.skip("transformers 4.x: refused by name (test_transformers_4_refused_by_name)")
    for message in run_on_ranks(2, _layout_refused, config):
        assert expected in message, message
