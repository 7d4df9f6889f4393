"""Sequence parallelism for HF ViT / DeiT (split_gather, all_to_all, ring_attn) and timm ViT (split_gather):
outputs, loss and every gradient equal to the unsharded model where the token count divides by
the group; the split really runs (collectives counted); a count that does not divide runs unsplit.
The ring splits ViT's tokens in contiguous parts (bidirectional attention): 10 tokens over 2 ranks,
which a zigzag split (4 | tokens) would have left unsplit."""

from __future__ import annotations

import pytest
import torch
from vit_cases import hf_batch, hf_build, timm_batch, timm_build, timm_loss

from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import assert_sharded_matches, run_on_ranks

SPLIT = {"enable_sequence_parallelism": True}  # split_gather
ULYSSES = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "all_to_all"}
RING = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "ring_attn"}
# 24-pixel images, 8-pixel patches: 9 patches + the class token = 10 tokens (DeiT: 11; 32 pixels: 17 / 18)
HF_IMAGE = {"ViTForImageClassification": 24, "DeiTForImageClassification": 32}


def _hf(cls_name: str, config: dict) -> dict:
    image = HF_IMAGE[cls_name]
    with count_collectives() as counts:
        report = assert_sharded_matches(
            lambda: hf_build(cls_name, image=image),
            hf_batch(cls_name, image=image),
            ShardConfig(**config),
            zero_grads=("*attention.k_proj.bias", "*attention.attention.key.bias"),  # softmax ignores a key bias
        )
    report["split"] = sum(counts.get(k, 0) for k in ("reduce_scatter", "all_to_all", "ring_shift"))
    return report


def _refused(cls_name: str, config: dict) -> str:
    from shardcore.testing import refusal_message

    return refusal_message(lambda: hf_build(cls_name, image=HF_IMAGE[cls_name]), ShardConfig(**config))


@pytest.mark.parametrize(
    ("cls_name", "config"),
    [
        ("ViTForImageClassification", {"tensor_parallel_size": 2, **SPLIT}),
        ("DeiTForImageClassification", {"tensor_parallel_size": 2, "enable_sequence_overlap": True, **SPLIT}),
        ("ViTForImageClassification", {"tensor_parallel_size": 1, "sequence_parallel_size": 2, **ULYSSES}),
        ("ViTForImageClassification", {"tensor_parallel_size": 1, "sequence_parallel_size": 2, **RING}),
        ("DeiTForImageClassification", {"tensor_parallel_size": 2, "sequence_parallel_size": 2, **RING}),
    ],
    ids=[
        "vit-split_gather-tp2",
        "deit-split_gather-overlap-tp2",
        "vit-all_to_all-sp2",
        "vit-ring_attn-sp2",
        "deit-ring_attn-sp2-tp2",
    ],
)
def test_hf_sequence_parallel_matches_unsharded(cls_name, config):
    import transformers

    world = config["tensor_parallel_size"] * config.get("sequence_parallel_size", 1)
    if "sequence_parallelism_mode" in config and int(transformers.__version__.split(".")[0]) < 5:
        for message in run_on_ranks(world, _refused, cls_name, config):  # 4.x: no attention registry to route
            mode = config["sequence_parallelism_mode"]
            assert message.startswith("NotImplementedError") and mode in message, message
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    for report in run_on_ranks(world, _hf, cls_name, config):
        assert "max_abs_diff_after_steps" in report, report
        assert report["split"] > 0, f"the tokens were not split: {report}"


def _timm(tp: int, reg_tokens: int) -> dict:
    def build():
        return timm_build("vit_small_patch16_224", depth=2, embed_dim=64, num_heads=4, reg_tokens=reg_tokens)

    with count_collectives() as counts:
        report = assert_sharded_matches(
            build, timm_batch(), ShardConfig(tensor_parallel_size=tp, **SPLIT), loss_fn=timm_loss
        )
    report["reduce_scatters"] = counts.get("reduce_scatter", 0)
    return report


@pytest.mark.parametrize(
    ("tp", "reg_tokens", "split"),
    [(4, 3, True), (2, 0, False)],  # 4 patches + class token + 3 registers = 8 tokens; without registers 5
    ids=["8-tokens-tp4", "5-tokens-tp2-unsplit"],
)
def test_timm_split_gather_matches_unsharded(tp, reg_tokens, split):
    for report in run_on_ranks(tp, _timm, tp, reg_tokens):
        assert "max_abs_diff_after_steps" in report, report
        assert (report["reduce_scatters"] > 0) == split, report


def _timm_dropout() -> dict:
    import shardcore
    from shardcore.testing import dropout_patterns

    torch.manual_seed(0)
    model = timm_build("vit_small_patch16_224", depth=2, embed_dim=64, num_heads=4, reg_tokens=3, proj_drop_rate=0.5)
    model = shardcore.optimize(model, ShardConfig(tensor_parallel_size=2, **SPLIT))
    return dropout_patterns(model, timm_batch(), ("blocks.0.attn.proj_drop", "blocks.0.mlp.drop2"))


def test_timm_dropout_on_split_tokens_draws_per_rank():
    report = run_on_ranks(2, _timm_dropout)[0]
    assert report["shapes"]["blocks.0.attn.proj_drop"] == (2, 4, 64), report  # 8 tokens, 4 per rank
    assert not report["same"]["blocks.0.attn.proj_drop"] and not report["same"]["blocks.0.mlp.drop2"], report
