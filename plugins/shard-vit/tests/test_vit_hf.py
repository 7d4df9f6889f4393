"""HuggingFace ViT and DeiT classes sharded against the unsharded model, on real gloo ranks."""

from __future__ import annotations

import pytest
from vit_cases import hf_batch, hf_build, hidden_loss

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, run_on_ranks

CLASSES = [
    "ViTModel",
    "ViTForImageClassification",
    "ViTForMaskedImageModeling",
    "DeiTModel",
    "DeiTForImageClassification",
]


def _check(tp: int, cls_name: str) -> dict:
    kwargs = {"loss_fn": hidden_loss} if cls_name.endswith("Model") else {}
    return assert_sharded_matches(
        lambda: hf_build(cls_name), hf_batch(cls_name), ShardConfig(tensor_parallel_size=tp), **kwargs
    )


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("cls_name", CLASSES)
def test_hf_vit_classes(tp, cls_name):
    run_on_ranks(tp, _check, tp, cls_name)


def _error(tp: int) -> str:
    import torch
    import torch.distributed as dist

    import shardcore

    torch.manual_seed(0)
    try:
        shardcore.optimize(
            hf_build("ViTForImageClassification", heads=6, hidden=48), ShardConfig(tensor_parallel_size=tp)
        )
        message = "no error"
    except ValueError as exc:
        message = str(exc)
    dist.barrier()
    return message


def test_heads_not_divisible():
    messages = run_on_ranks(4, _error, 4)
    assert all("num_attention_heads=6 is not divisible by tensor_parallel_size=4" in m for m in messages), messages
