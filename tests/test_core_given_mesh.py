"""``ShardConfig(device_mesh=mesh)``: a mesh the caller built (Lightning's, accelerate's, torchtitan's), its
dims read by name in any order, its groups used; each layout compared with the unsharded model (loss,
every gradient, 3 AdamW steps), and a mesh that contradicts the config refused before any collective."""

from __future__ import annotations

import pytest
import torch
from recent_models import batch, build
from toy_models import ToyLM, ToyPolicy

import shardcore
from shardcore import ShardConfig
from shardcore.testing import assert_data_parallel_matches, assert_sharded_matches, refusal_message, run_on_ranks


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def _batch() -> dict:
    ids = torch.randint(0, 101, (4, 10), generator=torch.Generator().manual_seed(3))
    return {"ids": ids, "labels": ids}


def _groups_of(model, mesh) -> dict:
    """Which of the layout's groups are the mesh's own, and where this rank sits."""
    import torch.distributed as dist

    layout = model.shardcore.layout
    dim = {"dp_replicate": "dp", "dp_shard": "dp"}  # (one of the two alone is the dp group)
    own = {name: layout.group(dim.get(role, role)) is mesh.get_group(name) for name, role in layout.given.roles.items()}
    return {"own": own, "coordinates": layout.coordinates(dist.get_rank()), "rank": dist.get_rank()}


def _tp() -> dict:
    mesh = _mesh((2,), ("tensor",))
    report = assert_sharded_matches(lambda: build("Qwen3", 2), batch(), ShardConfig(device_mesh=mesh))
    torch.manual_seed(0)
    return report | _groups_of(shardcore.optimize(build("Qwen3", 2), ShardConfig(device_mesh=mesh)), mesh)


def test_tp_zero_config_on_the_callers_mesh():
    for report in run_on_ranks(2, _tp):
        assert report["own"] == {"tensor": True}, report
        assert report["coordinates"] == {"dp": 0, "pp": 0, "sp": 0, "tp": report["rank"]}, report


def _fsdp_tp_outermost(mode: str) -> dict:
    """TP the outer dim: a TP group is ranks {0, 2} or {1, 3}, not consecutive ranks."""
    # --8<-- [start:mesh]
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tensor_parallel", "data_parallel"))
    config = ShardConfig(device_mesh=mesh, data_parallel=mode)  # tp=2, dp=2 from the mesh, its groups used
    # --8<-- [end:mesh]
    report = assert_data_parallel_matches(ToyLM, _batch(), config, policy=ToyPolicy)
    torch.manual_seed(0)
    again = shardcore.optimize(ToyLM(), ShardConfig(device_mesh=mesh), policy=ToyPolicy)
    return report | _groups_of(again, mesh)


@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_fsdp_and_ddp_by_tp_on_a_mesh_with_tp_outermost(mode):
    for report in run_on_ranks(4, _fsdp_tp_outermost, mode):
        assert report["own"] == {"tensor_parallel": True, "data_parallel": True}, report
        rank = report["rank"]
        assert report["coordinates"] == {"dp": rank % 2, "pp": 0, "sp": 0, "tp": rank // 2}, report
        assert (report["dp"], report["tp"]) == (2, 2), report


def _accelerate() -> dict:
    """The mesh accelerate's ParallelismConfig builds (dims ("dp_shard", "tp"), a flattened "dp" beside)."""
    from accelerate.parallelism_config import ParallelismConfig

    mesh = ParallelismConfig(dp_shard_size=2, tp_size=2).build_device_mesh("cpu")
    config = ShardConfig(device_mesh=mesh, data_parallel="fsdp")
    report = assert_data_parallel_matches(ToyLM, _batch(), config, policy=ToyPolicy)
    torch.manual_seed(0)
    return report | _groups_of(shardcore.optimize(ToyLM(), ShardConfig(device_mesh=mesh), policy=ToyPolicy), mesh)


def test_fsdp_by_tp_on_the_mesh_accelerates_parallelism_config_builds():
    for report in run_on_ranks(4, _accelerate):
        assert report["own"] == {"dp_shard": True, "tp": True}, report
        assert abs(report["state_fraction"] - 1 / 4) <= 0.05 / 4, report


def _hsdp() -> dict:
    mesh = _mesh((2, 2), ("dp_replicate", "shards"))  # a name of the caller's, mapped
    config = ShardConfig(device_mesh=mesh, device_mesh_dims={"shards": "dp_shard"}, data_parallel="hsdp")
    return assert_data_parallel_matches(ToyLM, _batch(), config, policy=ToyPolicy)


def test_hsdp_on_the_meshs_replicate_and_shard_dims():
    for report in run_on_ranks(4, _hsdp):
        assert abs(report["state_fraction"] - 1 / 2) <= 0.05, report  # split over dp_shard=2 only


def _pipeline_tp() -> dict:
    from shardcore.testing.pipeline import assert_pipeline_matches

    mesh = _mesh((2, 2), ("pp", "tp"))
    return assert_pipeline_matches(lambda: build("Qwen3", 2), batch(rows=2), ShardConfig(device_mesh=mesh))


def test_pipeline_by_tp_zero_config_on_a_mesh():
    run_on_ranks(4, _pipeline_tp)


MISMATCHES = [
    (
        ((4,), ("tensor",)),
        {"tensor_parallel_size": 2},
        "the mesh gives tp=4 (its 'tensor' dim) but tensor_parallel_size=2",
    ),
    (((2, 2), ("dp", "tp")), {"pipeline_parallel_size": 2}, "the mesh gives pp=1 (it has no pp dim)"),
    (((2, 2), ("dp", "model")), {}, "the mesh's dim 'model' is none of shardcore's degrees"),
    (((2, 2), ("dp", "ep")), {}, "expert parallelism is carved from the data-parallel ranks"),
    (((2, 2), ("cp", "sp")), {}, "the mesh's dims 'cp' and 'sp' are both 'sp'"),
    (((2, 2), ("dp", "tp")), {"data_parallel": "hsdp"}, "build it with 'dp_replicate' before 'dp_shard'"),
    (((2, 2), ("dp", "model")), {"device_mesh_dims": {"model": "mp"}}, "maps 'model' to 'mp'"),
]


def _refused(shape, names, fields: dict, sliced: bool) -> str:
    mesh = _mesh(shape, names)  # built first: creating it is collective, the refusal after must not be
    return refusal_message(
        ToyLM, ShardConfig(device_mesh=mesh[names[-1]] if sliced else mesh, **fields), policy=ToyPolicy
    )


@pytest.mark.parametrize(("mesh", "fields", "expected"), MISMATCHES, ids=lambda x: None)
def test_a_mesh_contradicting_the_config_is_refused_by_name_before_any_collective(mesh, fields, expected):
    for message in run_on_ranks(4, _refused, *mesh, fields, False):
        assert expected in message, f"not refused by name: {message}"


def test_a_slice_of_the_mesh_is_refused():
    for message in run_on_ranks(4, _refused, (2, 2), ("dp", "tp"), {}, True):
        assert "the mesh spans 2 ranks but the world has 4; pass the root mesh" in message, message


def test_auto_and_a_mesh_are_refused_together():
    with pytest.raises(ValueError, match=r"chooses the layout, but device_mesh=.* was given too"):
        ShardConfig(auto=True, device_mesh=object())
