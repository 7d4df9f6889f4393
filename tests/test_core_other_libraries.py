"""Models from libraries other than transformers and timm, sharded against the unsharded model:
torchvision's Vision Transformer (``examples/torchvision_vit.py``) by ``plan="derive"`` and by a plan
that also splits its 10-class head (gathered, padded). fp32: the conformance kit's bounds."""

from __future__ import annotations

import pathlib

import pytest
import torch.nn.functional as F

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, example_main, run_on_ranks

pytest.importorskip("torchvision", reason="torchvision is in the suite's environment (shard-vit's timm extra)")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "torchvision_vit.py"

#: derive's MLP split, and the classifier split over its classes (10: padded, gathered back)
HEAD_PLAN = {
    "encoder.layers.encoder_layer_*.mlp.0.weight": ["tp", None],
    "encoder.layers.encoder_layer_*.mlp.0.bias": ["tp"],
    "encoder.layers.encoder_layer_*.mlp.3.weight": [None, "tp"],
    "heads.head.weight": ["tp", None],
    "heads.head.bias": ["tp"],
}


def _vit(tp: int, plan) -> dict:
    ex = example_main(EXAMPLE).__globals__
    images, labels = ex["batch"]()
    config = ShardConfig(tensor_parallel_size=tp, plan=plan)
    return assert_sharded_matches(
        ex["build"], {"x": images}, config, loss_fn=lambda logits: F.cross_entropy(logits, labels)
    )


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("plan", ["derive", "head"])
def test_torchvision_vit_matches_unsharded(tp, plan):
    """Logits, loss, every gradient and three AdamW steps equal the unsharded model's."""
    run_on_ranks(tp, _vit, tp, "derive" if plan == "derive" else HEAD_PLAN)


@pytest.mark.parametrize("tp", [2, 4])
def test_the_torchvision_example_trains_like_the_unsharded_model(tp):
    unsharded = example_main(EXAMPLE)(["--unsharded"])
    for got in run_on_ranks(tp, example_main(EXAMPLE), ["--tp", str(tp)]):
        for a, b in zip(got["losses"], unsharded["losses"], strict=True):
            assert abs(a - b) <= 1e-5 * abs(b), (got, unsharded)
