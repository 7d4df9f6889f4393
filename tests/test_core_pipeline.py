"""The pipeline core without a model family: pipeline_step without stages, the even split, and a
policy without the pipeline hooks refused before any collective."""

from __future__ import annotations

import torch
from toy_models import ToyLM, ToyPolicy

import shardcore
from shardcore import ShardConfig
from shardcore.pipeline import split_layers
from shardcore.testing import refusal_message, run_on_ranks


def test_pipeline_step_without_a_pipeline_is_forward_and_backward():
    torch.manual_seed(0)
    model, twin = ToyLM(), ToyLM()
    twin.load_state_dict(model.state_dict())
    ids = torch.randint(0, 101, (2, 8))
    loss = shardcore.pipeline_step(model, {"ids": ids, "labels": ids})
    expected = twin(ids, labels=ids)["loss"]
    expected.backward()
    assert loss.item() == expected.item() and not loss.requires_grad
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name


def test_even_split_gives_the_first_stages_one_more():
    for blocks, stages, want in [(4, 2, [2, 2]), (5, 2, [3, 2]), (7, 4, [2, 2, 2, 1])]:
        got = split_layers(blocks, stages)
        assert got == want, f"{blocks} blocks over {stages} stages split as {got}, not {want}"


def _refused() -> str:
    return refusal_message(ToyLM, ShardConfig(pipeline_parallel_size=2), policy=ToyPolicy)


def test_a_policy_without_pipeline_hooks_is_refused():
    for message in run_on_ranks(2, _refused):
        assert "ToyPolicy does not support pipeline parallelism" in message, message
        assert "leave pipeline_parallel_size=1" in message, message
