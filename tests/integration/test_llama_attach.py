"""What optimize attached to a Llama, listed by ``print(model.shardcore)`` in the order it runs, and the
list checked against the hooks and methods actually on the model (``assert_attachments_listed``)."""

from __future__ import annotations

import torch
from llama_cases import build, lm_batch

import shardcore
from shardcore import ShardConfig
from shardcore.testing import assert_attachments_listed, run_on_ranks


def _listed(config: dict, train: bool) -> dict:
    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(**config))
    batch = lm_batch()
    if train:
        found = assert_attachments_listed(model, lambda: model(**batch))
    else:  # through pipeline stages: a forward outside a stage is for inference
        model.eval()
        with torch.no_grad():
            found = assert_attachments_listed(model, lambda: model(input_ids=batch["input_ids"]))
    found["text"] = str(model.shardcore)
    return found


def test_a_tp2_llama_lists_what_runs_around_its_forward():
    for found in run_on_ranks(2, _listed, {"tensor_parallel_size": 2}, True):
        assert found["before"] == ["scope", "new_adapters", "grad_mark", "same_inputs", "checkpointing"], found
        assert found["after"] == ["overflow_agreement", "scope"], found
        assert found["routes"] == [
            "loss_function: ['vocab_parallel']",
            "forward: ['logits_gather_deferred']",
            "generate: ['same_sampling']",
            "clip_grad_norm_: ['sharded_norm']",
            "save_pretrained: ['whole_checkpoint']",
        ], found
        text = found["text"]
        assert "1. scope [register]" in text and "4. same_inputs [guards]" in text, text
        assert "forward: logits_gather_deferred [shard]" in text and "-> the model's own" in text, text
        assert "inside the model (found on its modules):" in text, text  # the layers' regions and streams


def test_a_pp2_x_tp2_llama_lists_the_pipeline_route():
    config = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "num_microbatches": 2}
    for found in run_on_ranks(4, _listed, config, False):
        assert found["before"] == ["scope", "new_adapters", "grad_mark", "same_inputs", "checkpointing"], found
        assert "forward: ['logits_gather_deferred', 'pipeline']" in found["routes"], found
        assert "generate: ['same_sampling', 'pipeline']" in found["routes"], found
        assert (
            "forward: pipeline [pipeline]: the whole pipeline outside a stage -> logits_gather_deferred"
            in found["text"]
        ), found["text"]
