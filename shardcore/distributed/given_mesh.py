"""A device mesh the caller built: ``ShardConfig(device_mesh=mesh)``.

The convention of the PyTorch ecosystem is "here is the mesh, parallelize on it": Lightning's
``ModelParallelStrategy`` hands its ``parallelize_fn`` a mesh ``("data_parallel", "tensor_parallel")``,
accelerate's ``ParallelismConfig`` builds ``("dp_replicate", "dp_shard", "cp", "tp")``, torchtitan
``("pp", "dp_replicate", "dp_shard", "cp", "tp")``. :func:`layout_of_mesh` reads such a mesh as a
:class:`~shardcore.ParallelLayout`: each dim by its name (:data:`DIM_NAMES`, or the caller's
``ShardConfig(device_mesh_dims=...)``), the degrees from its sizes, and each rank's place from the
mesh's own rank grid, in whatever order its dims come (TP need not be innermost). Every refusal
(an unknown or doubled name, a mesh smaller than the world, a size the config contradicts) is
raised here, before any collective.

The layout's groups are then the mesh's own (:func:`view_of_mesh`): a dim the mesh has is its
group, not a copy. What the mesh lacks is made once per mesh: the flat data-parallel group when
the mesh splits ``dp`` into ``dp_replicate x dp_shard``, and groups of one rank for the degrees it
leaves out; the expert-parallel groups are made as without a mesh.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs
import torch
import torch.distributed as dist

from .groups import own_row_group

if TYPE_CHECKING:
    from ..config import ShardConfig

__all__ = ["DIM_NAMES", "GivenMesh", "completed_config", "hsdp_of_mesh", "layout_of_mesh", "view_of_mesh"]

#: the names a mesh dim may carry, by the degree it is; ``dp_replicate`` x ``dp_shard`` make ``dp``
DIM_NAMES = {
    "tp": ("tp", "tensor_parallel", "tensor"),
    "pp": ("pp", "pipeline_parallel", "pipeline"),
    "sp": ("sp", "cp", "context_parallel", "sequence_parallel"),
    "dp": ("dp", "data_parallel", "data"),
    "dp_replicate": ("dp_replicate",),
    "dp_shard": ("dp_shard",),
}
#: ``{(id of the mesh, rank grid): (the default group, the mesh, its view)}``
_VIEWS: dict[tuple, tuple] = {}


@attrs.frozen
class GivenMesh:
    """The caller's mesh and what each of its dims is (``{mesh dim name: degree}``)."""

    mesh: Any = attrs.field(eq=False)
    roles: dict[str, str]

    def name_of(self, degree: str) -> str | None:
        return next((name for name, role in self.roles.items() if role == degree), None)


def _refuse(what: str) -> ValueError:
    return ValueError(f"ShardConfig(device_mesh=...): {what}")


def _roles(mesh, extra: dict[str, str] | None) -> dict[str, str]:
    names = getattr(mesh, "mesh_dim_names", None)
    if not hasattr(mesh, "get_group") or not names:
        raise _refuse(
            f"{type(mesh).__name__} is not a DeviceMesh with named dims; build it with "
            "torch.distributed.device_mesh.init_device_mesh(device, shape, mesh_dim_names=('dp', 'tp'))"
        )
    known = {alias: role for role, aliases in DIM_NAMES.items() for alias in aliases} | dict(extra or {})
    roles = {}
    for name in names:
        if name not in known:
            hint = (
                "expert parallelism is carved from the data-parallel ranks: build the mesh without it and set "
                "expert_parallel_size"
                if name in ("ep", "expert_parallel")
                else f"the names shardcore reads are {sorted(known)}; name it one of those or map it with "
                f"ShardConfig(device_mesh_dims={{{name!r}: 'tp'}}) (a degree of {sorted(DIM_NAMES)})"
            )
            raise _refuse(f"the mesh's dim {name!r} is none of shardcore's degrees; {hint}")
        if known[name] not in DIM_NAMES:
            raise _refuse(f"device_mesh_dims maps {name!r} to {known[name]!r}, not one of {sorted(DIM_NAMES)}")
        doubled = [n for n, r in roles.items() if r == known[name]]
        if doubled:
            raise _refuse(f"the mesh's dims {doubled[0]!r} and {name!r} are both {known[name]!r}; keep one")
        roles[name] = known[name]
    if "dp" in roles.values() and {"dp_replicate", "dp_shard"} & set(roles.values()):
        raise _refuse("the mesh has a 'dp' dim beside 'dp_replicate' / 'dp_shard'; dp is their product, keep either")
    return roles


def _check_sizes(config: ShardConfig, sizes: dict[str, int], roles: dict[str, str]) -> None:
    named = {role: name for name, role in roles.items()}
    fields = {
        "tp": ("tensor_parallel_size", config.tensor_parallel_size),
        "dp": ("data_parallel_size", config.data_parallel_size),
        "pp": ("pipeline_parallel_size", config.pipeline_parallel_size),
        "sp": ("sequence_parallel_size", config.sequence_parallel_size),
    }
    for degree, (field, given) in fields.items():  # pp and sp at their default 1: the mesh's
        if given is not None and given != sizes[degree] and not (degree in ("pp", "sp") and given == 1):
            where = f"its {named[degree]!r} dim" if degree in named else f"it has no {degree} dim"
            if degree == "dp" and degree not in named and {"dp_replicate", "dp_shard"} & set(named):
                where = "its dp_replicate x dp_shard dims"
            raise _refuse(
                f"the mesh gives {degree}={sizes[degree]} ({where}) but {field}={given}; leave {field} unset "
                "where the mesh gives it, or build the mesh with the degrees you set"
            )
    if config.tensor_parallel_process_group is not None:
        raise _refuse("tensor_parallel_process_group was given too; the mesh's tp dim is the tensor-parallel group")


def _check_hsdp(config: ShardConfig, mesh, roles: dict[str, str]) -> None:
    if config.data_parallel != "hsdp":
        return
    names = list(roles)
    rep, shard = (next((n for n in names if roles[n] == r), None) for r in ("dp_replicate", "dp_shard"))
    if rep is None or shard is None or names.index(rep) > names.index(shard):
        raise _refuse(
            "data_parallel='hsdp' replicates over the mesh's 'dp_replicate' dim and shards over its 'dp_shard' "
            f"dim, but the mesh's dims are {tuple(names)}; build it with 'dp_replicate' before 'dp_shard'"
        )
    size = mesh.size(names.index(shard))
    if config.data_parallel_shard_size not in (None, size):
        raise _refuse(
            f"the mesh's {shard!r} dim has {size} ranks but data_parallel_shard_size={config.data_parallel_shard_size}; "
            "leave it unset (the mesh gives it) or make them agree"
        )


def layout_of_mesh(config: ShardConfig, world: int) -> dict[str, Any]:
    """The :class:`~shardcore.ParallelLayout` of ``config.device_mesh`` in a world of ``world`` ranks, as
    its fields (no collective): degrees from the mesh's sizes, each rank's place from its rank grid."""
    mesh = config.device_mesh
    roles = _roles(mesh, config.device_mesh_dims)
    if mesh.size() != world:
        raise _refuse(
            f"the mesh spans {mesh.size()} ranks but the world has {world}; pass the root mesh (every rank), "
            "not one of its slices"
        )
    names = list(roles)
    size = {role: mesh.size(names.index(name)) for name, role in roles.items()}
    sizes = {d: size.get(d, 1) for d in ("pp", "sp", "tp")}
    sizes["dp"] = size.get("dp", 1) * size.get("dp_replicate", 1) * size.get("dp_shard", 1)
    _check_sizes(config, sizes, roles)
    _check_hsdp(config, mesh, roles)
    order = ("dp", "dp_replicate", "dp_shard", "pp", "sp", "tp")
    grid = mesh.mesh.permute([names.index(n) for n in sorted(names, key=lambda n: order.index(roles[n]))])
    shape = tuple(sizes[d] for d in ("dp", "pp", "sp", "tp"))
    if math.prod(shape) != grid.numel():  # a dim of the mesh left unread would be a silent mistake
        raise _refuse(f"the mesh's shape {tuple(mesh.mesh.shape)} is not the product of its degrees {shape}")
    ranks = tuple(grid.reshape(shape).flatten().tolist())
    given = GivenMesh(mesh, roles)
    degrees = dict(zip(("dp", "pp", "sp", "tp"), shape, strict=True))
    return {**degrees, "world_size": world, "ep": config.expert_parallel_size, "ranks": ranks, "given": given}


def completed_config(config: ShardConfig, layout) -> ShardConfig:
    """``config`` with the sizes its mesh gives filled in (the degrees, HSDP's shard group), so what
    reads the config sees the mesh's layout (no collective)."""
    shard = None
    if config.data_parallel == "hsdp":
        shard = layout.given.mesh.size(list(layout.given.roles).index(layout.given.name_of("dp_shard")))
    sizes = {"tensor_parallel_size": layout.tp, "data_parallel_size": layout.dp, "pipeline_parallel_size": layout.pp}
    return attrs.evolve(config, **sizes, sequence_parallel_size=layout.sp, data_parallel_shard_size=shard)


def _own_group(grid: torch.Tensor, dim: int):
    """This rank's group along ``dim`` of ``grid``: every row made (collective, one order on every rank)."""
    return own_row_group(grid.movedim(dim, -1).reshape(-1, grid.shape[dim]).tolist(), dist.get_rank())


def view_of_mesh(layout):
    """The ``("dp", "pp", "sp", "tp")`` mesh of ``layout`` on its given mesh's groups (collective on
    first use: the groups the mesh lacks are made then; cached per mesh)."""
    from torch.distributed.device_mesh import DeviceMesh

    given, dims = layout.given, tuple(layout.degrees)  # ("dp", "pp", "sp", "tp")
    key = (id(given.mesh), layout.ranks)
    entry = _VIEWS.get(key)
    if entry is None or entry[0] is not dist.group.WORLD or entry[1] is not given.mesh:
        grid = torch.tensor(layout.ranks).reshape(tuple(layout.degrees.values()))
        halves = [given.name_of(h) for h in ("dp_replicate", "dp_shard") if given.name_of(h)]
        groups = []
        for i, dim in enumerate(dims):
            name = given.name_of(dim)
            if (
                dim == "dp" and name is None and len(halves) == 1
            ):  # one of the two alone: accelerate's ("dp_shard", "tp")
                name = halves[0]
            groups.append(given.mesh.get_group(name) if name is not None else _own_group(grid, i))
        view = DeviceMesh.from_group(groups, given.mesh.device_type, mesh=grid, mesh_dim_names=dims)
        _VIEWS[key] = entry = (dist.group.WORLD, given.mesh, view)
    return entry[2]


def hsdp_of_mesh(layout):
    """The caller's ``("dp_replicate", "dp_shard")`` slice of the given mesh (HSDP; no collective)."""
    given = layout.given
    return given.mesh[(given.name_of("dp_replicate"), given.name_of("dp_shard"))]
