"""HuggingFace ViT and DeiT classes sharded against the unsharded model, on real gloo ranks."""

from __future__ import annotations

import pytest
from vit_cases import hf_batch, hf_build

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, hidden_state_loss, refusal_message, run_on_ranks

CLASSES = [
    "ViTModel",
    "ViTForImageClassification",
    "ViTForMaskedImageModeling",
    "DeiTModel",
    "DeiTForImageClassification",
]


def _check(tp: int, cls_name: str) -> dict:
    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state", "pooler_output")} if cls_name.endswith("Model") else {}
    return assert_sharded_matches(
        lambda: hf_build(cls_name),
        hf_batch(cls_name),
        ShardConfig(tensor_parallel_size=tp),
        # softmax ignores a shift of every key: zero gradient (transformers 5 name, 4.x name)
        zero_grads=("*attention.k_proj.bias", "*attention.attention.key.bias"),
        **kwargs,
    )


@pytest.mark.parametrize("tp", [2, 4])  # TP=1 returns the model itself: tested once, in the core
@pytest.mark.parametrize("cls_name", CLASSES)
def test_hf_vit_classes(tp, cls_name):
    run_on_ranks(tp, _check, tp, cls_name)


def _error(tp: int) -> str:
    return refusal_message(
        lambda: hf_build("ViTForImageClassification", heads=6, hidden=48), ShardConfig(tensor_parallel_size=tp)
    )


def test_heads_not_divisible():
    messages = run_on_ranks(4, _error, 4)
    assert all("num_attention_heads=6 is not divisible by tensor_parallel_size=4" in m for m in messages), messages
