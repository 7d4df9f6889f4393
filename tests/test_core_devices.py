"""No CPU tensor on a device group: the tensors shardcore makes for its own collectives (the input
check's digest, the pipeline's and the checkpoint writer's receive buffers, the pipeline loss) live
on the device the group needs: the CPU for gloo or a group with a CPU backend, the current CUDA
device for an NCCL-only group. Checked here by the rule itself, and by the input check asking it."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from shardcore import consistency
from shardcore.distributed import watch


@pytest.mark.parametrize(
    ("backend", "expected"),
    [("nccl", "cuda:3"), ("cuda:nccl", "cuda:3"), ("gloo", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"), ("fake", "cpu")],
)
def test_the_device_a_group_needs(monkeypatch, backend, expected):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend_config", lambda group: backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert watch.group_device(object()) == torch.device(expected)


def test_no_process_group_means_the_cpu(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    assert watch.group_device(None) == torch.device("cpu")


def test_the_input_check_puts_its_digest_where_the_group_needs_it(monkeypatch):
    """The default first forward's all-gather (the check of the inputs across the group) gets its
    digest on the group's device, not on the CPU (an NCCL-only group refuses CPU tensors)."""
    seen = []

    def gather(tensor, group, dim, where=None):
        seen.append(tensor.device)
        return tensor

    monkeypatch.setattr(consistency, "group_device", lambda group: torch.device("meta"))
    monkeypatch.setattr(consistency, "all_gather_cat", gather)
    monkeypatch.setattr(torch, "equal", lambda a, b: True)  # meta tensors hold no values to compare
    consistency.check_inputs(object(), "Toy.forward", (torch.ones(2, 3),), {})
    assert seen == [torch.device("meta")], "the input check's digest was made on the CPU, not the group's device"


@pytest.mark.parametrize(("cuda", "expected"), [(True, "cpu:gloo,cuda:nccl"), (False, "gloo")])
def test_the_group_shardcore_starts_has_a_cpu_backend_beside_nccl(monkeypatch, cuda, expected):
    """``init_from_env`` on a GPU machine starts NCCL with gloo beside it (PyTorch routes a CPU tensor
    to gloo), so a CPU tensor of anyone's never reaches NCCL; on a CPU machine, gloo."""
    import shardcore.distributed as distributed

    started = []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: started.append(backend))
    distributed.init_from_env(1.0)
    assert started == [expected]


@pytest.mark.parametrize("user_set", [False, True])
def test_the_group_shardcore_starts_on_a_gpu_has_nccl_s_flight_recorder_on(monkeypatch, user_set):
    """On a GPU ``init_from_env`` turns PyTorch's flight recorder on before NCCL reads it (a hang then
    dumps every rank's last collectives); a value the user set is theirs. On a CPU nothing is set."""
    import shardcore.distributed as distributed

    seen = []
    for name in distributed.FLIGHT_RECORDER:
        monkeypatch.delenv(name, raising=False)
    if user_set:
        monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    record = {name: None for name in distributed.FLIGHT_RECORDER}
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kwargs: seen.append({n: os.environ.get(n) for n in record})
    )
    distributed.init_from_env(1.0)
    want = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0" if user_set else "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert seen == [want], f"the flight recorder's variables when NCCL starts: {seen}, not {want}"


@pytest.mark.parametrize(
    ("backend", "expected_s"),
    [("cpu:gloo,cuda:nccl", 14.0), ("nccl", 14.0), ("gloo", None)],
)
def test_the_groups_shardcore_creates_on_nccl_wait_twice_the_bound(monkeypatch, backend, expected_s):
    """Per-group timeouts: a group shardcore creates on a world with NCCL (its own watchdog) ends a
    hung collective at twice the model's bound, as the world group init_from_env starts; on gloo
    the group keeps torch's default (shardcore's bounded wait ends the hang there)."""
    from datetime import timedelta

    from shardcore.distributed import groups
    from shardcore.distributed.collectives import set_collective_timeout

    made = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: backend)
    monkeypatch.setattr(dist, "new_group", lambda ranks, timeout=None: made.append(timeout))
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    set_collective_timeout(7.0)
    try:
        groups.new_group([0])
        override = groups.mesh_backend_override(("dp", "pp", "tp"), (2, 1, 4))  # tp spans the world of 4
    finally:
        set_collective_timeout(None)
    expected = None if expected_s is None else timedelta(seconds=expected_s)
    assert made == [expected], f"the group's timeout: {made}, want {expected}"
    if expected is None:
        assert override is None, override
    elif not hasattr(dist, "ProcessGroupNCCL"):
        pytest.skip("this torch is built without NCCL: no NCCL options to carry a device mesh's timeout")
    else:  # a dimension spanning the world keeps the world group (no override), as torch's mesh does
        assert set(override) == {"dp", "pp"}, override
        assert all(o._timeout == expected for o in override.values()), (
            f"the mesh's groups would not wait twice the bound: {[o._timeout for o in override.values()]}"
        )


@pytest.mark.parametrize(
    ("backend", "expected"),
    [("cpu:gloo,cuda:nccl", "cuda"), ("nccl", "cuda"), ("gloo", "cpu")],
)
def test_the_meshes_shardcore_builds_are_on_the_gpu_when_the_world_runs_nccl(monkeypatch, backend, expected):
    """FSDP2 puts a module's shards on its mesh's device: under init_from_env's "cpu:gloo,cuda:nccl"
    the layout's mesh must be a CUDA mesh, not a CPU one (the backend string is not "nccl" there)."""
    from shardcore.distributed import groups

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: backend)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert groups.mesh_device() == expected, f"a {groups.mesh_device()} mesh on a world running {backend}"
