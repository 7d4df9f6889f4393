"""ShardConfig validation and the errors optimize raises before any collective."""

from __future__ import annotations

import pytest
import torch
from toy_models import ToyLM, ToyPolicy

import shardcore
from shardcore import ShardConfig
from shardcore.config import _NOT_BUILT
from shardcore.testing import run_on_ranks


def test_defaults():
    cfg = ShardConfig()
    assert cfg.tensor_parallel_size is None and cfg.enable_tensor_parallelism and not cfg.parallel_output
    assert cfg.make_vocab_size_divisible_by == 64


@pytest.mark.parametrize("bad", [0, -1])
def test_tensor_parallel_size_must_be_positive(bad):
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        ShardConfig(tensor_parallel_size=bad)


def test_config_is_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        ShardConfig(2)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        ShardConfig().tensor_parallel_size = 2  # type: ignore[misc]


@pytest.mark.parametrize("field", sorted(_NOT_BUILT))
def test_unbuilt_feature_flags_raise(field):
    value = "ring" if field == "sequence_parallelism_mode" else True
    with pytest.raises(NotImplementedError, match=f"ShardConfig.{field}="):
        ShardConfig(**{field: value})


def test_from_env():
    assert ShardConfig.from_env({"SHARDCORE_TP": "4"}).tensor_parallel_size == 4
    assert ShardConfig.from_env({}).tensor_parallel_size is None
    with pytest.raises(ValueError, match="SHARDCORE_TP"):
        ShardConfig.from_env({"SHARDCORE_TP": "two"})


def test_single_process_is_a_no_op():
    model = ToyLM()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert shardcore.optimize(model, policy=ToyPolicy) is model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_tp_larger_than_world_in_one_process():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 is larger than the world size 1.*torchrun"):
        shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=2), policy=ToyPolicy)


def _expect_error(config_kwargs: dict, model_kwargs: dict, seed_by_rank: bool = False) -> str:
    """Raise-and-report on every rank, then prove no rank hangs: a barrier must still complete."""
    import torch.distributed as dist

    torch.manual_seed(dist.get_rank() if seed_by_rank else 0)
    try:
        shardcore.optimize(ToyLM(**model_kwargs), ShardConfig(**config_kwargs), policy=ToyPolicy)
    except (ValueError, RuntimeError) as exc:
        message = str(exc)
    else:
        message = "no error"
    dist.barrier()
    return message


@pytest.mark.parametrize(
    ("world", "config", "model", "expected"),
    [
        (2, {"tensor_parallel_size": 4}, {}, "tensor_parallel_size=4 is larger than the world size 2"),
        (4, {"tensor_parallel_size": 3}, {}, "not a multiple of ShardConfig.tensor_parallel_size=3"),
        (4, {"tensor_parallel_size": 4}, {"heads": 2}, "num_heads=2 is not divisible by tensor_parallel_size=4"),
        (2, {"tensor_parallel_size": 2}, {"hidden": 127}, "hidden=127 is not divisible by tensor_parallel_size=2"),
    ],
)
def test_bad_input_fails_on_every_rank_without_hanging(world, config, model, expected):
    messages = run_on_ranks(world, _expect_error, config, model)
    assert all(expected in m for m in messages), messages


def test_different_weights_on_ranks_are_detected():
    messages = run_on_ranks(2, _expect_error, {"tensor_parallel_size": 2}, {}, True)
    assert all("ranks hold different weights" in m for m in messages), messages
