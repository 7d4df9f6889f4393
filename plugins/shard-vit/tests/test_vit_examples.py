"""examples/vision_transformers.py, the lines docs/quickstart.md shows, on 2 ranks: timm's logits
and the HuggingFace ViT's loss equal the same models unsharded."""

from __future__ import annotations

import pathlib

import pytest

from shardcore.testing import example_main, run_on_ranks

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "vision_transformers.py"


def _run(args: list[str]):
    return example_main(EXAMPLE)(args)


def test_the_vision_example_gives_the_unsharded_outputs():
    pytest.importorskip("timm", reason="the example shards a timm model: pip install './plugins/shard-vit[timm]'")
    logits_ref, loss_ref = _run(["--unsharded"])
    for logits, loss in run_on_ranks(2, _run, ["--tp", "2"]):
        assert logits.shape == logits_ref.shape == (2, 1000)
        assert (logits - logits_ref).abs().max().item() <= 1e-4
        assert abs(loss - loss_ref) <= 1e-5 * abs(loss_ref)
