"""ShardConfig validation and the errors optimize raises before any collective."""

from __future__ import annotations

import pytest
import torch
from toy_models import ToyLM, ToyPolicy

import shardcore
from shardcore import ShardConfig
from shardcore.plugin_api import block_type
from shardcore.testing import count_c10d_calls, refusal_message, run_on_ranks


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


def test_sequence_parallel_flags_are_checked_in_the_constructor():
    with pytest.raises(
        ValueError, match="'ring' is not a mode; choose one of split_gather, all_to_all, ring_attn, all_gather_kv"
    ):
        ShardConfig(enable_sequence_parallelism=True, sequence_parallelism_mode="ring")
    with pytest.raises(ValueError, match=r"enable_sequence_overlap=True.*enable_sequence_parallelism=False"):
        ShardConfig(enable_sequence_overlap=True)
    with pytest.raises(ValueError, match="without enable_sequence_parallelism=True"):
        ShardConfig(sequence_parallelism_mode="split_gather")


def test_sequence_parallel_size_needs_a_mode_that_takes_it():
    messages = run_on_ranks(2, _expect_error, {"tensor_parallel_size": 1, "sequence_parallel_size": 2}, {})
    assert all("ValueError: sequence_parallel_size=2 without sequence parallelism" in m for m in messages), messages


@pytest.mark.parametrize("field", ["pipeline_parallel_size", "sequence_parallel_size", "data_parallel_size"])
@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_degrees_must_be_positive_integers(field, bad):
    with pytest.raises((ValueError, TypeError), match=field):
        ShardConfig(**{field: bad})


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
    """Refused on every rank before any collective (different weights can only be found together)."""
    import torch.distributed as dist

    return refusal_message(
        lambda: ToyLM(**model_kwargs),
        ShardConfig(**config_kwargs),
        policy=ToyPolicy,
        seed=dist.get_rank() if seed_by_rank else 0,
        collectives_allowed=seed_by_rank,
    )


@pytest.mark.parametrize(
    ("world", "config", "model", "expected"),
    [
        (2, {"tensor_parallel_size": 4}, {}, "tensor_parallel_size=4 is larger than the world size 2"),
        (4, {"tensor_parallel_size": 3}, {}, "world size 4 is not a multiple of pp=1 x sp=1 x tp=3 = 3"),
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


def _optimize_counted() -> dict:
    from shardcore.tensor_parallel import count_collectives

    torch.manual_seed(0)
    with count_collectives() as counts:
        shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=2), policy=ToyPolicy)
    return dict(counts)


def test_the_same_weights_check_is_a_counted_bounded_collective():
    """optimize's one collective (every rank's weights compared) goes through shardcore's bounded,
    counted all-gather, not a raw c10d call that no bound and no count sees."""
    for counts in run_on_ranks(2, _optimize_counted):
        assert counts == {"all_gather": 1}, counts


@pytest.mark.parametrize(
    ("world", "config", "expected"),
    [
        # the layout is checked first: it fails as a layout even though PP is not built yet
        (2, {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, "dp=(rest), pp=2, sp=1, tp=2 needs 4 ranks"),
        (4, {"tensor_parallel_size": 2, "sequence_parallel_size": 2, "data_parallel_size": 2}, "needs 8 ranks"),
        (4, {"tensor_parallel_size": 2, "pipeline_parallel_size": 3}, "dp=(rest), pp=3, sp=1, tp=2"),
        (4, {"tensor_parallel_size": 1, "data_parallel_size": 2}, "dp=2, pp=1, sp=1, tp=1 uses 2 ranks"),
    ],
)
def test_wrong_layout_names_every_degree_and_the_world(world, config, expected):
    messages = run_on_ranks(world, _expect_error, config, {})
    for message in messages:
        assert expected in message, messages
        assert f"world size {world}" in message or f"world size is {world}" in message, messages
        assert all(d in message for d in ("dp=", "pp=", "sp=", "tp=")), messages


def _layout_groups(tp: int) -> dict:
    import torch.distributed as dist

    layout = shardcore.ParallelLayout.from_config(ShardConfig(tensor_parallel_size=tp))
    return {
        "degrees": layout.degrees,
        "tp": dist.get_process_group_ranks(layout.group("tp")),
        "dp": dist.get_process_group_ranks(layout.group("dp")),
        "coords": layout.coordinates(dist.get_rank()),
    }


def test_tp_is_innermost_consecutive_ranks():
    out = run_on_ranks(4, _layout_groups, 2)
    assert out[0]["degrees"] == {"dp": 2, "pp": 1, "sp": 1, "tp": 2}
    assert [o["tp"] for o in out] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [o["dp"] for o in out] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [o["coords"] for o in out] == [{"dp": d, "pp": 0, "sp": 0, "tp": t} for d in range(2) for t in range(2)]


def test_layout_in_one_process():
    layout = shardcore.ParallelLayout.from_config(ShardConfig(pipeline_parallel_size=2, tensor_parallel_size=2), 8)
    assert layout.degrees == {"dp": 2, "pp": 2, "sp": 1, "tp": 2}
    by_hand = [{"dp": d, "pp": p, "sp": 0, "tp": t} for d in range(2) for p in range(2) for t in range(2)]
    for rank, want in enumerate(by_hand):  # TP innermost: a TP group is consecutive ranks (one node's)
        got = layout.coordinates(rank)
        assert got == want, f"rank {rank} of dp2 x pp2 x tp2 sits at {got}, not {want}"
    assert shardcore.ParallelLayout.from_config(ShardConfig(), 4).degrees == {"dp": 1, "pp": 1, "sp": 1, "tp": 4}
    with pytest.raises(ValueError, match=r"dp=1, pp=2, sp=1, tp=2 uses 4 ranks, but the world size is 8"):
        shardcore.ParallelLayout(dp=1, pp=2, tp=2, world_size=8)


def test_parallel_output_refused_by_a_policy_that_does_not_support_it():
    assert not ToyPolicy().tensor_parallel().parallel_output
    with pytest.raises(NotImplementedError, match=r"ToyPolicy does not support ShardConfig\(parallel_output=True\)"):
        shardcore.optimize(ToyLM(), ShardConfig(parallel_output=True), policy=ToyPolicy)


def _calls_of_a_sharding(tp: int) -> dict:
    torch.manual_seed(0)
    with count_c10d_calls() as calls:
        shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=tp), policy=ToyPolicy)
    return dict(calls)


def test_c10d_calls_are_counted():
    """The counter used by refusal_message sees what a real sharding sends (the same-weights check)."""
    for calls in run_on_ranks(2, _calls_of_a_sharding, 2):
        gathers = ("all_gather", "all_gather_single", "all_gather_into_tensor")
        assert sum(calls.get(name, 0) for name in gathers) >= 1, calls


class _NoEntryPolicy(ToyPolicy):
    """Builds q/k/v with copy_input=False but never enters the tensor-parallel region."""

    def module_policy(self):
        from toy_models import ToyBlock

        from shardcore import ModulePolicyDescription
        from shardcore.builders import attention

        return {
            ToyBlock: ModulePolicyDescription(sub_module_replacement=attention("", 4, 16, names=("a", "b", "c", "d")))
        }


def _missing_entry(tp: int) -> str:
    return refusal_message(ToyLM, ShardConfig(tensor_parallel_size=tp), policy=_NoEntryPolicy)


def test_copy_input_false_without_enter_tp_region_is_refused():
    messages = run_on_ranks(2, _missing_entry, 2)
    assert all(
        "'a' of ToyBlock is built with copy_input=False, but no enter_tp_region entry holds it" in m for m in messages
    ), messages


def test_block_type_names_mixed_blocks():
    from shardcore import Policy

    class Mixed(Policy):
        def blocks(self):
            return [("0", torch.nn.Linear(1, 1)), ("1", torch.nn.ReLU())]

    policy = Mixed()
    policy.set_model(torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.ReLU()))
    with pytest.raises(ValueError, match=r"found \['Linear', 'ReLU'\]"):
        block_type(policy.blocks(), policy.model)
