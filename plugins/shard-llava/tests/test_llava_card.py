"""``shardcore check`` on a Llava (a CLIP vision tower, a Llama) over data parallelism x TP=2 (4 gloo
ranks), with an image on one data-parallel rank only: the other rank's part is text, so without its
idle run that rank would skip the vision tower (FSDP: a collective mismatch, a crash on gloo and a
hang on NCCL; DDP: a reducer waiting for gradients). The card passes with the vision tower and
projector compared as a part; and with images on both ranks under DDP, which waited for the
gradients of the tower's post_layernorm (Llava never reads it) before ``static_graph``."""

from __future__ import annotations

import pytest
import torch
from llava_cases import IMAGE, batch_for, build

import shardcore
from shardcore import ShardConfig


def text_only(rows: int = 2, seed: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, IMAGE, (rows, 14), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_the_card_passes_with_an_image_on_one_data_parallel_rank_only(mode):
    config = ShardConfig(tensor_parallel_size=2, data_parallel=mode, data_parallel_size=2)
    card = shardcore.check(build, config, batch=[batch_for(rows=2), text_only()])
    print("\n" + card.format())
    vision = next(r for r in card.rows if r.what == "gradients: vision tower or projector")
    assert vision.passed and card.passed, card.format()


def four_layers():
    return build(num_hidden_layers=4)  # an interleaved schedule's 4 stages


@pytest.mark.parametrize(("mode", "schedule"), [("ddp", "1F1B"), ("fsdp", "1F1B"), ("fsdp", "Interleaved1F1B")])
def test_pipeline_stages_over_data_parallel_ranks_with_an_image_on_one_rank_only(mode, schedule):
    """PP=2 x DP=2: the text-only rank's first stage runs the tower idle, its other stages never do (an
    interleaved schedule's rank 0 runs stages 0 and 2 on the same model)."""
    config = ShardConfig(pipeline_parallel_size=2, pipeline_schedule=schedule, num_microbatches=2, data_parallel=mode,
                         data_parallel_size=2)  # fmt: skip
    card = shardcore.check(four_layers, config, batch=[batch_for(rows=2), text_only()])
    print("\n" + card.format())
    vision = next(r for r in card.rows if r.what == "gradients: vision tower or projector")
    assert vision.passed and card.passed, card.format()


def test_the_card_passes_with_images_on_every_rank_under_ddp():
    config = ShardConfig(tensor_parallel_size=2, data_parallel="ddp", data_parallel_size=2)
    card = shardcore.check(build, config, batch=batch_for(rows=4))
    assert card.passed, card.format()
