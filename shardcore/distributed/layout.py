"""``ParallelLayout``: one validated description of how the world is cut, and the mesh built from it.

Four degrees, ``dp x pp x sp x tp == world size``:

* ``tp``: tensor parallel, ranks holding slices of every layer (innermost);
* ``sp``: sequence / context parallel (Ulysses, ring attention) ranks;
* ``pp``: pipeline stages;
* ``dp``: data-parallel replicas (outermost).

Expert parallelism (``ep``) is carved from ``dp``, as in Megatron-LM and torchtitan: ``ep`` consecutive
data-parallel ranks (each training on its own data) hold the experts between them, the dense
weights stay data-parallel over all of ``dp``; ``dp / ep`` such groups replicate the experts.

The :class:`~torch.distributed.device_mesh.DeviceMesh` has the named dims ``("dp", "pp", "sp",
"tp")`` in that order, so **TP is innermost: a TP group is consecutive ranks** (rank
``((dp·PP + pp)·SP + sp)·TP + tp``), which keeps the most talkative group on one host. Meshes are
built once per layout and cached, so optimizing many models does not leak process groups.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs
import torch.distributed as dist
from attrs import validators as v

from .groups import mesh_backend_override, mesh_device, new_group

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..config import ShardConfig

__all__ = ["DIMS", "ParallelLayout"]

DIMS = ("dp", "pp", "sp", "tp")
#: ``{degrees: (the default group it was built in, the mesh)}``: a re-initialized world builds anew
_MESHES: dict[tuple[int, ...], tuple] = {}
_positive = [v.instance_of(int), v.ge(1)]


def _current_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


@attrs.frozen(kw_only=True)
class ParallelLayout:
    """The parallel degrees of a run; ``dp * pp * sp * tp`` must equal ``world_size``."""

    dp: int = attrs.field(default=1, validator=_positive)
    pp: int = attrs.field(default=1, validator=_positive)
    sp: int = attrs.field(default=1, validator=_positive)
    tp: int = attrs.field(default=1, validator=_positive)
    world_size: int = attrs.field(default=1, validator=_positive)
    #: expert-parallel ranks, carved from ``dp`` (not a factor of the world size)
    ep: int = attrs.field(default=1, validator=_positive)
    #: the global rank at each ``(dp, pp, sp, tp)`` place, row-major; ``None``: TP innermost, as above
    ranks: tuple[int, ...] | None = None
    #: the caller's device mesh the layout was read from (:mod:`.given_mesh`), whose groups it uses
    given: Any = attrs.field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if math.prod(self.degrees.values()) != self.world_size:
            raise ValueError(self._mismatch(f"{self.describe()} uses {math.prod(self.degrees.values())} ranks"))
        if self.dp % self.ep:
            raise ValueError(
                f"parallel layout: ep={self.ep} does not divide the data-parallel degree ({self.describe()}, "
                f"world size {self.world_size}); the expert-parallel ranks are carved from the data-parallel "
                f"ones, so choose an expert_parallel_size that divides dp={self.dp} (or more data-parallel ranks)"
            )

    @property
    def degrees(self) -> dict[str, int]:
        return {d: getattr(self, d) for d in DIMS}

    def describe(self) -> str:
        text = ", ".join(f"{d}={n}" for d, n in self.degrees.items())
        return text + (f" (ep={self.ep} of dp)" if self.ep > 1 else "")

    def _mismatch(self, what: str) -> str:
        return f"parallel layout does not fit the world: {what}, but the world size is {self.world_size}"

    # ---- from a ShardConfig -----------------------------------------------------------------
    @classmethod
    def from_config(cls, config: ShardConfig, world_size: int | None = None) -> ParallelLayout:
        """The layout ``config`` asks for in a world of ``world_size`` ranks. No collective.

        ``tensor_parallel_size=None`` takes the ranks no other degree uses (``dp`` defaults to 1
        then); ``data_parallel_size=None`` takes the ranks left over by the others. A layout
        that does not fit raises ``ValueError`` printing every degree and the world size.
        """
        world = _current_world_size() if world_size is None else world_size
        if config.device_mesh is not None:
            from .given_mesh import layout_of_mesh

            return cls(**layout_of_mesh(config, world))
        pp, sp = config.pipeline_parallel_size, config.sequence_parallel_size
        tp, dp = config.tensor_parallel_size, config.data_parallel_size
        if config.tensor_parallel_process_group is not None:
            tp = dist.get_world_size(config.tensor_parallel_process_group)
        given = {"dp": dp, "pp": pp, "sp": sp, "tp": tp}
        shown = ", ".join(f"{d}={'(rest)' if n is None else n}" for d, n in given.items())
        fixed = math.prod(n for n in given.values() if n is not None)
        if fixed > world:
            hint = (
                f"torch.distributed is not initialized: launch with `torchrun --nproc_per_node {fixed} your_script.py`"
                if not dist.is_initialized()
                else f"launch {fixed} processes (torchrun --nproc_per_node {fixed}) or lower the degrees"
            )
            if given == {"dp": None, "pp": 1, "sp": 1, "tp": tp}:
                raise ValueError(
                    f"ShardConfig.tensor_parallel_size={tp} is larger than the world size {world}; {hint}."
                )
            raise ValueError(f"parallel layout {shown} needs {fixed} ranks, more than the world size {world}; {hint}.")
        if world % fixed:
            raise ValueError(
                f"parallel layout does not fit the world: {shown}, world size {world} is not a multiple of "
                f"{' x '.join(f'{d}={n}' for d, n in given.items() if n is not None)} = {fixed}; choose degrees "
                f"whose product divides {world} (the data-parallel degree takes the rest)."
            )
        if tp is None:
            tp = world // (pp * sp * (dp or 1))
        if dp is None:
            dp = world // (pp * sp * tp)
        if dp * pp * sp * tp != world:
            raise ValueError(
                f"parallel layout does not fit the world: dp={dp}, pp={pp}, sp={sp}, tp={tp} uses "
                f"{dp * pp * sp * tp} ranks, but the world size is {world}; make the product of the degrees equal it."
            )
        ep = config.expert_parallel_size
        if dp % ep and given["tp"] is None:
            raise ValueError(
                f"parallel layout: expert_parallel_size={ep} is carved from the data-parallel ranks, but "
                f"tensor_parallel_size=None took every rank left (tp={tp}, dp={dp}, world size {world}); set "
                f"tensor_parallel_size (e.g. tensor_parallel_size={max(1, world // (pp * sp * ep))}) so that "
                f"dp = world / (pp x sp x tp) is a multiple of {ep}"
            )
        return cls(dp=dp, pp=pp, sp=sp, tp=tp, world_size=world, ep=ep)

    def completed(self, config: ShardConfig) -> ShardConfig:
        """``config`` with the sizes the caller's mesh gives filled in; ``config`` itself without one."""
        if self.given is None:
            return config
        from .given_mesh import completed_config

        return completed_config(config, self)

    # ---- the mesh and its groups ----------------------------------------------------------------
    def mesh(self) -> DeviceMesh:
        """The cached ``("dp", "pp", "sp", "tp")`` device mesh (collective on first use)."""
        if self.given is not None:
            from .given_mesh import view_of_mesh

            return view_of_mesh(self)
        key = tuple(self.degrees.values())
        if _MESHES.get(key, (None,))[0] is not dist.group.WORLD:
            from torch.distributed.device_mesh import init_device_mesh

            device = mesh_device()
            mesh = init_device_mesh(device, key, mesh_dim_names=DIMS, backend_override=mesh_backend_override(DIMS, key))
            _MESHES[key] = (dist.group.WORLD, mesh)
        return _MESHES[key][1]

    def hsdp_mesh(self, shard: int) -> DeviceMesh:
        """The data-parallel ranks as a 2-D ``("dp_replicate", "dp_shard")`` mesh, ``shard`` consecutive
        data-parallel ranks per shard group (HSDP); cached like :meth:`mesh` (collective on first use)."""
        if self.given is not None:
            from .given_mesh import hsdp_of_mesh

            return hsdp_of_mesh(self)
        key = ("hsdp", shard, *self.degrees.values())
        if _MESHES.get(key, (None,))[0] is not dist.group.WORLD:
            from torch.distributed.device_mesh import init_device_mesh

            device = mesh_device()
            shape = (self.dp // shard, shard, self.pp, self.sp, self.tp)
            names = ("dp_replicate", "dp_shard", *DIMS[1:])
            full = init_device_mesh(
                device, shape, mesh_dim_names=names, backend_override=mesh_backend_override(names, shape)
            )
            _MESHES[key] = (dist.group.WORLD, full["dp_replicate", "dp_shard"])
        return _MESHES[key][1]

    def tp_groups(self) -> list[list[int]]:
        """Every tensor-parallel group's global ranks (TP is the mesh's innermost dim)."""
        order = self.ranks or range(self.world_size)
        return [list(order[start : start + self.tp]) for start in range(0, self.world_size, self.tp)]

    def group(self, dim: str):
        """The process group of this rank along ``dim`` (one of ``dp``, ``pp``, ``sp``, ``tp``)."""
        if dim not in DIMS:
            raise KeyError(f"unknown mesh dimension {dim!r}; the dimensions are {DIMS}")
        return self.mesh().get_group(dim)

    def expert_groups(self) -> tuple:
        """``(ep, experts, replicas)``: this rank's process groups for expert parallelism. ``ep``: the
        ``ep`` data-parallel ranks sharing one set of experts (same pp, sp, tp coordinates); ``experts``:
        those ranks with their tensor-parallel peers, ``ep x tp`` ranks holding one copy of every expert
        (group rank ``e * tp + t``); ``replicas``: the ``dp / ep`` ranks holding the same experts.
        Built once per layout (every rank creates every group, in the same order: collective)."""
        if not dist.is_initialized():  # explain: this process plays rank 0 of each group, on paper
            from .collectives import PaperGroup

            return PaperGroup(0, self.ep), PaperGroup(0, self.ep * self.tp), PaperGroup(0, self.dp // self.ep)
        key = ("ep", *self.degrees.values(), self.ep, self.ranks)
        if _MESHES.get(key, (None,))[0] is not dist.group.WORLD:
            rank, built = dist.get_rank(), {}
            for kind, ranks in self._expert_rank_lists():
                group = new_group(ranks)
                if rank in ranks:
                    built[kind] = group
            _MESHES[key] = (dist.group.WORLD, (built["ep"], built["experts"], built["replicas"]))
        return _MESHES[key][1]

    def built_expert_groups(self) -> tuple:
        """:meth:`expert_groups` as already built (no collective: ``optimize`` builds them before any
        layer, as it does the replica groups); raises naming the fix when they were not."""
        if not dist.is_initialized():
            return self.expert_groups()  # on paper: nothing to build
        built = _MESHES.get(("ep", *self.degrees.values(), self.ep, self.ranks))
        if built is None or built[0] is not dist.group.WORLD:
            raise RuntimeError(
                f"the expert-parallel groups of layout {dict(self.degrees)} are not built: call layout.expert_groups() "
                "on every rank before building an expert-parallel layer (shardcore.optimize does); creating groups "
                "is collective over the whole world"
            )
        return built[1]

    def _expert_rank_lists(self):
        """Every expert-parallel group's ranks, tagged with their kind, in one order on every rank."""
        ep, rep = self.ep, self.dp // self.ep

        rank = self.rank_at
        for r in range(rep):
            for p in range(self.pp):
                for s in range(self.sp):
                    for t in range(self.tp):
                        yield ("ep", [rank(r * ep + e, p, s, t) for e in range(ep)])
                    yield ("experts", [rank(r * ep + e, p, s, t) for e in range(ep) for t in range(self.tp)])
        for e in range(ep):
            for p in range(self.pp):
                for s in range(self.sp):
                    for t in range(self.tp):
                        yield ("replicas", [rank(r * ep + e, p, s, t) for r in range(rep)])

    def rank_at(self, dp: int, pp: int, sp: int, tp: int) -> int:
        """The global rank at mesh place ``(dp, pp, sp, tp)``."""
        place = ((dp * self.pp + pp) * self.sp + sp) * self.tp + tp
        return place if self.ranks is None else self.ranks[place]

    def coordinates(self, rank: int) -> dict[str, int]:
        """``{dim: index}`` of global ``rank`` on the mesh (TP innermost unless the layout came from a mesh)."""
        if self.ranks is not None:
            rank = self.ranks.index(rank)
        out = {}
        for d in reversed(DIMS):
            rank, out[d] = divmod(rank, getattr(self, d))
        return {d: out[d] for d in DIMS}
