"""Data parallelism on the mesh's dp dim (FSDP2 / DDP) with the core's toy model: training like the
unsharded model on the whole batch, and the refusals, each before any collective on every rank."""

from __future__ import annotations

import pytest
import torch
from toy_models import ToyLM, ToyPolicy

import shardcore
from shardcore import ShardConfig
from shardcore.testing import assert_data_parallel_matches, dp_part, refusal_message, run_on_ranks


def _batch() -> dict:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 101, (4, 10), generator=g)
    return {"ids": ids, "labels": ids}


def _train(dp: int, tp: int, mode: str) -> dict:
    return assert_data_parallel_matches(
        ToyLM,
        _batch(),
        ShardConfig(tensor_parallel_size=tp, data_parallel_size=dp, data_parallel=mode),
        policy=ToyPolicy,
    )


@pytest.mark.parametrize(("mode", "fraction"), [("fsdp", 1 / 4), ("ddp", 1 / 2)])
def test_toy_trains_like_unsharded_at_dp2_tp2(mode, fraction):
    for report in run_on_ranks(4, _train, 2, 2, mode):
        assert abs(report["state_fraction"] - fraction) <= 0.05 * fraction, report


class _NoBlocks(ToyPolicy):
    def blocks(self):
        raise NotImplementedError("_NoBlocks has no blocks")


def _refused(config: dict, policy=ToyPolicy, seed_by_dp: bool = False) -> str:
    import torch.distributed as dist

    if "tensor_parallel_process_group" in config:  # built here, before the refusal is counted
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both, in one order
        config = {**config, "tensor_parallel_process_group": groups[dist.get_rank() // 2]}
    return refusal_message(
        ToyLM,
        ShardConfig(**config),
        policy=policy,
        seed=dist.get_rank() // 2 if seed_by_dp else 0,  # same within each TP group, not across dp
        collectives_allowed=seed_by_dp,
    )


FSDP = {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"}


@pytest.mark.parametrize(
    ("config", "policy", "expected"),
    [
        (FSDP, _NoBlocks, "wraps each block of _NoBlocks.blocks(), which this policy does not implement"),
        ({**FSDP, "data_parallel": "ddp", "inference_only": True}, ToyPolicy, "an inference-only model has none"),
        ({**FSDP, "tensor_parallel_process_group": True}, ToyPolicy, "runs on shardcore's device mesh"),
        ({**FSDP, "expert_parallel_size": 2}, ToyPolicy, "has no experts to split or route"),
        ({**FSDP, "global_batch_balance": True}, ToyPolicy, "has no experts to split or route"),
        (
            {**FSDP, "expert_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": None},
            ToyPolicy,
            "ep=2 does not divide the data-parallel degree (dp=1, pp=2, sp=1, tp=2",
        ),
        (
            {"tensor_parallel_size": 1, "data_parallel": "hsdp", "data_parallel_shard_size": 3},
            ToyPolicy,
            "give a data_parallel_shard_size that divides 4",
        ),
        ({**FSDP, "data_parallel": "zero2"}, _NoBlocks, "ShardConfig(data_parallel='zero2') wraps each block"),
    ],
    ids=[
        "fsdp-without-blocks",
        "ddp-inference-only",
        "own-tp-group",
        "ep-without-experts",
        "balance-without-experts",
        "ep-not-dividing-dp",
        "hsdp-shard-not-dividing-dp",
        "zero2-without-blocks",
    ],
)
def test_refused_before_any_collective_on_every_rank(config, policy, expected):
    messages = run_on_ranks(4, _refused, config, policy)
    assert all(expected in m for m in messages), messages


def test_weights_differing_across_data_parallel_ranks_are_detected():
    # each TP group agrees, the two data-parallel replicas do not: FSDP would mix them silently
    messages = run_on_ranks(4, _refused, FSDP, ToyPolicy, True)
    assert all("ranks hold different weights" in m for m in messages), messages


def test_data_parallel_mode_is_validated():
    with pytest.raises(ValueError, match="data_parallel"):
        ShardConfig(data_parallel="zero3")
    with pytest.raises(
        ValueError, match=r"data_parallel_shard_size=2\) is HSDP's shard group, but data_parallel='fsdp'"
    ):
        ShardConfig(data_parallel="fsdp", data_parallel_shard_size=2)
    with pytest.raises(ValueError, match=r"mixed_precision='bf16'\) is FSDP2's mixed precision .* use data_parallel="):
        ShardConfig(data_parallel="ddp", mixed_precision="bf16")
    with pytest.raises(ValueError, match="mixed_precision"):
        ShardConfig(data_parallel="fsdp", mixed_precision="fp8")


def test_data_parallel_of_one_rank_changes_nothing():
    model = shardcore.optimize(ToyLM(), ShardConfig(data_parallel="fsdp"), policy=ToyPolicy)
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())
    assert getattr(model, "shardcore", None) is None


def test_dp_part_splits_the_batch_and_names_a_bad_size():
    batch = _batch()
    parts = [dp_part(batch, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([p["ids"] for p in parts]), batch["ids"])
    with pytest.raises(ValueError, match="'ids' has batch size 4, not divisible by data_parallel_size=3"):
        dp_part(batch, 0, 3)


def _outer_ddp(config: dict) -> str:
    """A DDP over the whole world around the sharded model (what accelerate's ``prepare(model)`` builds)."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = shardcore.optimize(ToyLM(), ShardConfig(**config), policy=ToyPolicy)
    with shardcore.testing.count_c10d_calls() as calls:
        try:
            DistributedDataParallel(model)
            return "no error"
        except RuntimeError as err:
            assert not calls, f"refused only after {dict(calls)} calls to other ranks"
            return str(err)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (FSDP, "its data parallelism is shardcore's already (data_parallel='fsdp' over dp=2)"),
        ({**FSDP, "data_parallel": "ddp"}, "its data parallelism is shardcore's already (data_parallel='ddp'"),
        (
            {"tensor_parallel_size": 2, "data_parallel_size": 2},
            "dp=2 replicas without shardcore's data parallelism: the split parameters' gradients would not",
        ),
    ],
    ids=["fsdp", "ddp", "dp-without-data-parallel"],
)
def test_a_ddp_from_outside_is_refused_by_name_where_it_cannot_be_right(config, expected):
    for message in run_on_ranks(4, _outer_ddp, config):
        assert expected in message and "accelerator.prepare(optimizer)" in message, f"wanted {expected!r}: {message}"
