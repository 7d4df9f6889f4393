"""Ranks of one TP group that disagree (inputs) or wait for each other forever (a collective only
some ranks call) raise a named error instead of computing garbage or hanging."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from toy_models import ToyLM, ToyPolicy, toy_batch

import shardcore
from shardcore import ShardConfig
from shardcore.consistency import InputMismatch, input_digests
from shardcore.distributed.collectives import CollectiveTimeout
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import RankPool, rank_zero_only, run_on_ranks


def _sharded(check_inputs: bool = True, timeout: float | None = None) -> ToyLM:
    torch.manual_seed(0)
    config = ShardConfig(
        tensor_parallel_size=dist.get_world_size(), check_inputs=check_inputs, collective_timeout=timeout
    )
    return shardcore.optimize(ToyLM(vocab=128), config, policy=ToyPolicy)


def _differing_inputs(case: str) -> str:
    model = _sharded()
    batch = toy_batch(128)
    rank = dist.get_rank()
    if case == "ids" and rank == 1:
        batch["ids"] = batch["ids"].flip(0)  # the same tokens, another order: a shuffled loader
    if case == "labels" and rank == 1:
        del batch["labels"]
    with pytest.raises(InputMismatch) as err:
        model(**batch)
    model(**toy_batch(128))  # the group is still in step afterwards
    return str(err.value)


@pytest.mark.parametrize("world", [2, 4])
def test_differing_ids_raise_on_every_rank(world):
    for message in run_on_ranks(world, _differing_inputs, "ids"):
        ranks = [r for r in range(world) if r != 1]
        assert f"'ids' differs (ranks {ranks}: shape [2, 8], int64, checksum" in message
        assert "ranks [1]: shape [2, 8], int64" in message
        assert "labels" not in message and "check_inputs=False" in message


def test_input_given_on_one_rank_only():
    for message in run_on_ranks(2, _differing_inputs, "labels"):
        assert "'labels' differs (ranks [0]: shape [2, 8], int64" in message and "missing on ranks [1]" in message


def _check_cost(check_inputs) -> list[int]:
    """The input check's all-gathers in each of five forwards: shapes [2, 8] twice, [2, 6], [2, 6], [2, 8]."""
    model = _sharded(check_inputs)
    costs = []
    for length in (8, 8, 6, 6, 8):
        batch = {k: v[:, :length] for k, v in toy_batch(128).items()}
        with count_collectives() as counts, torch.no_grad():
            model(**batch)
        costs.append(counts["all_gather"])
    return costs


def test_the_check_runs_on_the_first_forward_and_on_new_shapes_or_always_or_never():
    off = run_on_ranks(2, _check_cost, False)[0]
    default, always = run_on_ranks(2, _check_cost, True)[0], run_on_ranks(2, _check_cost, "always")[0]
    extra = [d - n for d, n in zip(default, off, strict=True)]
    assert extra == [1, 0, 1, 0, 1], f"the input check's all-gathers per forward: {extra}"
    assert always == [n + 1 for n in off], f"the input check's all-gathers per forward with 'always': {always}"
    with pytest.raises(ValueError):
        ShardConfig(check_inputs="sometimes")


def _later_difference(check_inputs) -> str:
    """Equal first batches, then rank 1's ids reordered with unchanged shapes."""
    model = _sharded(check_inputs)
    model(**toy_batch(128))
    batch = toy_batch(128)
    if dist.get_rank() == 1:
        batch["ids"] = batch["ids"].flip(0)
    try:
        model(**batch)
    except InputMismatch as err:
        return str(err)
    return "not checked"


def test_the_steady_state_is_checked_only_with_always():
    """What the default gives up for a sync-free steady state: a later batch that differs between
    ranks in content but not in shape is not seen; ``check_inputs="always"`` sees it."""
    assert run_on_ranks(2, _later_difference, True) == ["not checked"] * 2
    for message in run_on_ranks(2, _later_difference, "always"):
        assert "'ids' differs" in message


def test_digests_see_order_values_shape_and_dtype():
    ids = torch.arange(12).view(2, 6)
    base = input_digests((), {"ids": ids})["ids"][1]
    assert input_digests((), {"ids": ids.clone()})["ids"][1] == base
    for other in (ids.flip(0), ids.view(3, 4), ids.int(), ids + (ids == 11).long()):
        assert input_digests((), {"ids": other})["ids"][1] != base
    x = torch.randn(3, 5)
    assert input_digests((x,), {})["arg0"][1] != input_digests((x + 1e-7,), {})["arg0"][1]


#: the bound the test of a bound sets, and the process group's own timeout: a margin that scales with
#: it (on a loaded machine the bound must still end the wait first, named, before the group's does)
BOUND_S = 2
GROUP_S = 3 * BOUND_S


def _one_rank_calls(direction: str, check_inputs: bool, later_model: bool = False) -> str:
    model = _sharded(check_inputs, timeout=BOUND_S)
    if later_model:  # a second model with a long bound: the first keeps its own
        _sharded(check_inputs, timeout=300)
    batch = toy_batch(128)
    if direction == "backward":  # both ranks run forward; only rank 0 runs backward
        loss = model(**batch)["loss"]
        if dist.get_rank() == 0:
            with pytest.raises(CollectiveTimeout) as err:
                loss.backward()
            return str(err.value)
        time.sleep(2 * BOUND_S)  # past rank 0's bound
        return "slept"
    if dist.get_rank() == 0:  # the user's `if rank == 0: model(...)`
        with pytest.raises(CollectiveTimeout) as err:
            model(**batch)
        return str(err.value)
    try:
        dist.barrier()  # never matched: the group's own timeout (GROUP_S) ends it
    except RuntimeError as err:
        return f"barrier: {err}"
    return "barrier returned"


@pytest.mark.parametrize(
    ("direction", "check_inputs", "where"),
    [
        ("forward", False, "(forward of embed (VocabParallelEmbedding1D))"),
        ("backward", False, "(backward of "),
        # a fresh pool each, waiting out a bound: these in nox -s tests-slow (CI: one part in its turn, .ci/run)
        pytest.param("forward", True, "(input check at the entry of ToyLM.forward)", marks=pytest.mark.slow),
        pytest.param(
            "forward-later-model", False, "(forward of embed (VocabParallelEmbedding1D))", marks=pytest.mark.slow
        ),
        pytest.param("backward-later-model", False, "(backward of ", marks=pytest.mark.slow),
    ],
)
def test_a_collective_only_some_ranks_call_raises_within_the_bound(direction, check_inputs, where):
    """Within the model's own bound, also when a model built later in the process has another: the
    error names the bound that ended the wait (no clock read: a loaded machine is slower, not red)."""
    direction, _, later = direction.partition("-")
    pool = RankPool(2, timeout_s=GROUP_S)  # a group of its own: it ends broken
    try:
        message, other = pool.run(_one_rank_calls, direction, check_inputs, bool(later))
    finally:
        pool.close(force=True)
    if direction == "forward":
        # rank 1 never hangs: its barrier ends at the group's own timeout, or earlier when gloo closes
        # the pair rank 0 gave up on (which of the two comes first is a race inside gloo)
        assert other.startswith("barrier: ") and ("Timed out" in other or "Connection closed by peer" in other)
    assert f"waited more than {BOUND_S} s for the other ranks of its tensor-parallel group [0, 1]" in message, message
    assert where in message and "#" in message
    assert "`if rank == 0:` is the usual mistake" in message


def _counts_per_model() -> str:
    first, second = _sharded(False), _sharded(False)
    first(**toy_batch(128))["loss"].backward()
    assert sum(first.shardcore.scope.counts.values()) > 0, first.shardcore.scope.counts
    assert not second.shardcore.scope.counts, second.shardcore.scope.counts  # nothing of the first's
    with count_collectives() as seen:
        second(**toy_batch(128))["loss"].backward()
    assert second.shardcore.scope.counts == seen, (second.shardcore.scope.counts, seen)
    return "ok"


def test_each_model_counts_its_own_collectives():
    assert run_on_ranks(2, _counts_per_model) == ["ok"] * 2


def _unknown_token() -> str:
    model = _sharded()
    # vocabulary 128: the unsharded embedding raises here too. A device-side assert (no host sync):
    # on CPU it raises at once, on CUDA the kernel fails as the unsharded embedding's index check does
    with pytest.raises(RuntimeError) as err:
        model(ids=torch.tensor([[1, 2, 500]]))
    model(ids=torch.tensor([[1, 2, 127]]))  # the last id is in range, and the group is still in step
    return str(err.value)


def test_unknown_token_id_raises_instead_of_embedding_zeros():
    for message in run_on_ranks(2, _unknown_token):
        assert "a token id is outside the vocabulary [0, 128)" in message, message


def test_timeout_from_config_then_environment_then_default(monkeypatch):
    from shardcore.distributed.collectives import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, resolve_timeout

    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert resolve_timeout(None) == DEFAULT_TIMEOUT_S == 300.0
    monkeypatch.setenv(TIMEOUT_ENV, "42")
    assert resolve_timeout(None) == 42.0 and resolve_timeout(7) == 7.0
    for bad in ("soon", "-1"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"SHARDCORE_COLLECTIVE_TIMEOUT='{bad}'"):
            shardcore.optimize(ToyLM(vocab=128), ShardConfig(), policy=ToyPolicy)  # before any group exists
    with pytest.raises(ValueError):
        ShardConfig(collective_timeout=0)


def _toy_forward():
    model = _sharded(False, timeout=3)
    return lambda: model(**toy_batch(128))


def test_rank_zero_mistake_is_named_whichever_rank_gives_up_first():
    # equal bounds (the group's timeout = the collective bound = 3 s), as under torchrun before the
    # group waited twice the bound: rank 0 gets the named cause either way, never a bare transport error
    _, message, other = rank_zero_only(_toy_forward, group_timeout_s=3)
    assert message.startswith(("CollectiveTimeout: ", "CollectivePeerLost: ")), message
    assert "`if rank == 0:` is the usual mistake" in message and "(forward of embed" in message, message
    assert other.startswith("barrier: ")


def test_the_group_optimize_creates_waits_longer_than_the_bound(monkeypatch):
    import shardcore.distributed as sd

    seen = {}
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(sd.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(sd.dist, "init_process_group", lambda backend, timeout: seen.update(timeout=timeout))
    sd.init_from_env(20.0)
    assert seen["timeout"].total_seconds() == 40.0  # 2 x the 20 s bound: the bounded collective names it first


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_job_torchrun_restarted_gets_store_keys_of_its_own(monkeypatch, nodes):
    """torchrun's workers share the agent's store across restarts, its keys still holding the dead
    attempt's addresses (pytorch#135712: the new gloo group hung connecting to them). On one node
    each attempt gets keys of its own; across nodes (restart counts need not agree) a warning names
    torchrun's own fix."""
    import shardcore.distributed as sd

    seen = {}
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": str(2 // nodes), "MASTER_ADDR": "localhost"}
    env |= {"MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sd.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(sd.dist, "TCPStore", lambda *args, **kwargs: ("agent store", args))
    monkeypatch.setattr(sd.dist, "PrefixStore", lambda prefix, store: (prefix, store))
    monkeypatch.setattr(sd.dist, "init_process_group", lambda backend, **kwargs: seen.update(kwargs))
    if nodes == 2:
        with pytest.warns(UserWarning, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
            sd.init_from_env(20.0)
        assert "store" not in seen
        return
    sd.init_from_env(20.0)
    assert seen["store"][0] == "shardcore/attempt-3", f"a restarted job's group used the shared store's keys: {seen}"
    _, (_, (host, port, world, is_master)) = seen["store"]
    assert (host, port, world, is_master, seen["rank"], seen["world_size"]) == ("localhost", 29500, 2, False, 1, 2)
