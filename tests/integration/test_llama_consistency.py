"""Sampling under TP draws the same tokens on every rank whatever each rank was seeded with, and
a generate() only rank 0 calls raises within the bound instead of hanging."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from llama_cases import build, lm_batch

import shardcore
from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import rank_zero_only, run_on_ranks

SAMPLE = {"do_sample": True, "top_k": 50, "max_new_tokens": 12, "pad_token_id": 0, "use_cache": True}


def _model(config: ShardConfig | None = None):
    torch.manual_seed(0)
    model = build("LlamaForCausalLM", kv=2, vocab=1001, initializer_range=0.1).eval()
    return shardcore.optimize(model, config or ShardConfig(tensor_parallel_size=dist.get_world_size()))


def _sample(seeds: str) -> dict:
    model = _model()
    batch = lm_batch(1001, seed=3)
    ids = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    seed = 100 + dist.get_rank() if seeds == "per-rank" else 7
    torch.manual_seed(seed)  # as a user's script seeds after building the model
    with count_collectives() as counts, torch.no_grad():
        tokens = model.generate(**ids, **SAMPLE)
    result = {"tokens": tokens.tolist(), "broadcasts": counts["broadcast"], "all_gathers": counts["all_gather"]}
    if seeds == "equal":  # the unsharded model, same seed: the same draws
        torch.manual_seed(0)
        ref = build("LlamaForCausalLM", kv=2, vocab=1001, initializer_range=0.1).eval()
        torch.manual_seed(seed)
        with torch.no_grad():
            result["unsharded"] = ref.generate(**ids, **SAMPLE).tolist()
    return result


@pytest.mark.parametrize("world", [2, 4])
def test_sampling_with_per_rank_seeds_draws_the_same_tokens(world):
    results = run_on_ranks(world, _sample, "per-rank")
    assert all(r["tokens"] == results[0]["tokens"] for r in results)
    new = [row[12:] for row in results[0]["tokens"]]
    assert all(len(set(row)) >= 4 for row in new), new  # really sampled varied tokens
    # the price: per generate call one broadcast of the random state and one input check
    # (the other all-gathers: the vocabulary-split logits, one per step)
    assert all(r["broadcasts"] == 1 for r in results)
    assert all(r["all_gathers"] == 1 + SAMPLE["max_new_tokens"] for r in results)


def test_sampling_with_equal_seeds_matches_unsharded():
    results = run_on_ranks(2, _sample, "equal")
    assert results[0]["tokens"] == results[1]["tokens"] == results[0]["unsharded"]


def _generate_call():
    model = _model(ShardConfig(tensor_parallel_size=2, collective_timeout=3))
    batch = lm_batch(1001, seed=3)
    return lambda: model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **SAMPLE)


@pytest.mark.slow  # a fresh pool waiting out the group's timeout: nox -s tests-slow
def test_generate_on_rank_zero_only_raises_within_the_bound():
    seconds, message, other = rank_zero_only(_generate_call)  # the group's own timeout: 5 s
    assert message.startswith(("CollectiveTimeout: ", "CollectivePeerLost: ")), (seconds, message)
    assert "broadcast #" in message and "generate() entry" in message
    assert (
        "waited more than 3 s" in message or "lost a peer" in message
    ) and "`if rank == 0:` is the usual mistake" in message
    assert other.startswith("barrier: ")


def _generate_with_other_prompt_on_rank_1() -> str:
    model = _model()
    batch = lm_batch(1001, seed=3)
    ids = batch["input_ids"].flip(0) if dist.get_rank() == 1 else batch["input_ids"]
    with pytest.raises(shardcore.InputMismatch) as err:
        model.generate(input_ids=ids, attention_mask=batch["attention_mask"], **SAMPLE)
    return str(err.value)


def test_generate_checks_its_prompt_once_at_entry():
    for message in run_on_ranks(2, _generate_with_other_prompt_on_rank_1):
        assert message.startswith("LlamaForCausalLM.generate: the ranks of the tensor-parallel group [0, 1]")
        assert "'input_ids' differs" in message and "attention_mask" not in message
