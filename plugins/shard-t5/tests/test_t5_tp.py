"""Sharded T5, MT5 and UMT5 against the unsharded model, on real gloo ranks (the kit does the checking)."""

from __future__ import annotations

import pytest
import torch
from t5_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_explain_matches,
    assert_generate_matches,
    assert_save_pretrained_matches,
    assert_sharded_matches,
    hidden_state_loss,
    refusal_message,
    run_on_ranks,
)

#: at TP=2 each rank holds at most this share of the unsharded parameter bytes
MAX_FRACTION = 0.6


def _loss_fn(cls_name: str):
    if cls_name == "T5Model":
        return hidden_state_loss("last_hidden_state", "encoder_last_hidden_state")
    if cls_name == "T5EncoderModel":
        return hidden_state_loss("last_hidden_state")
    return None


def _check(tp: int, cls_name: str, family: str, cfg: dict) -> dict:  # module level: runs on every rank
    loss_fn = _loss_fn(cls_name)
    return assert_sharded_matches(
        lambda: build(cls_name, family, **cfg),
        batch_for(cls_name),
        ShardConfig(tensor_parallel_size=tp),
        max_param_fraction=MAX_FRACTION if tp == 2 else None,
        **({"loss_fn": loss_fn} if loss_fn else {}),
    )


#: T5 v1.1 / MT5 / UMT5's layout: gated-GELU feed-forward, an untied head, no rescaling of the decoder output
V11 = {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "untie": True}


@pytest.mark.parametrize(
    ("tp", "cls_name", "family", "cfg"),
    [
        (2, "T5ForConditionalGeneration", "T5", {}),
        (4, "T5ForConditionalGeneration", "T5", {}),
        (2, "T5ForConditionalGeneration", "T5", V11),
        (2, "T5Model", "T5", {}),
        (4, "T5EncoderModel", "T5", {}),
        (2, "T5ForConditionalGeneration", "MT5", V11),
        (2, "T5ForConditionalGeneration", "UMT5", V11),  # a relative attention bias in every block
        (4, "T5Model", "UMT5", V11),
    ],
    ids=["t5-tp2", "t5-tp4", "t5v11-tp2", "t5model-tp2", "encoder-tp4", "mt5-tp2", "umt5-tp2", "umt5model-tp4"],
)
def test_matches_unsharded(tp, cls_name, family, cfg):
    for report in run_on_ranks(tp, _check, tp, cls_name, family, cfg):
        assert "max_abs_diff_after_steps" in report, report


#: weights 5x T5's initialization: tokens that vary from step to step (and beams that change them), so the
#: check can fail
GENERATE = {"feed_forward_proj": "gated-gelu", "initializer_factor": 5.0}


def _generate(tp: int, family: str, beams: int):
    import shardcore

    torch.manual_seed(0)
    ref = build(family=family, **GENERATE).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build(family=family, **GENERATE), ShardConfig(tensor_parallel_size=tp)).eval()
    prompt = {k: v for k, v in batch_for("T5ForConditionalGeneration", seed=3).items() if k != "labels"}
    kwargs = {"max_new_tokens": 6, "do_sample": False, "num_beams": beams, "use_cache": True}
    return assert_generate_matches(ref, model, **prompt, **kwargs).tolist()


@pytest.mark.parametrize(("family", "beams"), [("T5", 1), ("T5", 3), ("UMT5", 1)], ids=["greedy", "beam", "umt5"])
def test_generate_matches_unsharded(family, beams):
    tokens = run_on_ranks(2, _generate, 2, family, beams)
    assert tokens[0] == tokens[1]


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(
        lambda: build(**V11), batch_for("T5ForConditionalGeneration"), ShardConfig(tensor_parallel_size=tp), path
    )


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))


def _explain(tp: int) -> dict:
    cls_name = "T5ForConditionalGeneration"
    batch = batch_for(cls_name, target=9)  # explain prices every block at the source's length
    return assert_explain_matches(lambda: build(cls_name), batch, ShardConfig(tensor_parallel_size=tp))


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind and bytes, and rank 0's bytes."""
    report = run_on_ranks(2, _explain, 2)[0]
    assert report["collectives_per_layer"]["T5Block"]["forward"]["all_reduce"] >= 2, report["collectives_per_layer"]


def _refused(tp: int, cfg: dict) -> str:
    return refusal_message(lambda: build(**cfg), ShardConfig(tensor_parallel_size=tp))


@pytest.mark.parametrize(
    ("cfg", "message"),
    [({"num_heads": 6}, "num_heads=6 is not divisible"), ({"d_ff": 66}, "d_ff=66 is not divisible")],
    ids=["heads", "d_ff"],
)
def test_not_divisible_refused_on_every_rank(cfg, message):
    assert all(message in m for m in run_on_ranks(4, _refused, 4, cfg))


def _layout_refused(config: dict) -> str:
    return refusal_message(build, ShardConfig(**config))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {
                "tensor_parallel_size": 1,
                "sequence_parallel_size": 2,
                "enable_sequence_parallelism": True,
                "sequence_parallelism_mode": "all_to_all",
            },
            "sequence_parallelism_mode='all_to_all' is refused: T5's attention is its own (not transformers' "
            "registry) and adds a relative position bias",
        ),
    ],
    ids=["sequence"],
)
def test_sequence_parallelism_refused_by_name(config, message):
    """What the README says is refused: on every rank, before any collective."""
    for refused in run_on_ranks(2, _layout_refused, config):
        assert message in refused, f"refused with {refused!r}"
