"""Sharded diffusion transformers against the unsharded model, on real gloo ranks (the kit checks the
denoiser's output, a loss on it, every gradient and three AdamW steps)."""

from __future__ import annotations

import pytest
from diffusers_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, hidden_state_loss, refusal_message, run_on_ranks

CLASSES = ["DiTTransformer2DModel", "PixArtTransformer2DModel"]


def _check(tp: int, cls_name: str) -> dict:
    return assert_sharded_matches(
        lambda: build(cls_name),
        batch_for(cls_name),
        ShardConfig(tensor_parallel_size=tp),
        loss_fn=hidden_state_loss("sample"),
        zero_grads=("*.to_k.bias",),  # softmax ignores a shift of every key
    )


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("cls_name", CLASSES)
def test_matches_unsharded(tp, cls_name):
    run_on_ranks(tp, _check, tp, cls_name)


def _refused(tp: int) -> str:
    return refusal_message(lambda: build(num_attention_heads=3), ShardConfig(tensor_parallel_size=tp))


def test_heads_not_divisible_refused_on_every_rank():
    assert all("num_attention_heads=3 is not divisible" in m for m in run_on_ranks(2, _refused, 2))
