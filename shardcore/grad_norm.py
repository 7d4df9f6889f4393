"""The gradient norm of a sharded model as the unsharded model has it, and clipping by it.

Every rank holds slices and copies of the unsharded gradient. The global p-norm counts each entry
of the unsharded gradient once::

    total ** p = sum over the ranks r of one model replica, over the entries e held on r:
                 |g_e| ** p / copies(e)

where ``copies(e)`` is the number of ranks of that replica holding entry ``e``: 1 for a slice of a
split parameter, ``tp`` for a parameter every tensor-parallel rank holds whole (norms, row biases),
``tp // num_shards`` for replicated key/value heads, 0 (left out) for vocabulary padding rows, times
``sp`` under Ulysses / ring attention (every sequence rank holds the whole model), times the stages
holding a tied parameter under pipeline parallelism. The sum is all-reduced over the ranks of one
replica — ``tp``, ``sp``, ``pp`` and, under FSDP or ZeRO-2, ``dp`` (whose ranks hold disjoint shards;
under HSDP its shard dim); DDP's replicas hold equal gradients and are not summed over. The infinity norm is a max over the same
ranks, padding left out. One all-reduce per dimension of size > 1, of one scalar; no host sync.

Three ways in, one computation (:func:`grad_norm`):

* :func:`clip_grad_norm_` (``shardcore.clip_grad_norm_``) and the sharded model's own
  ``model.clip_grad_norm_(max_norm)`` (what accelerate calls for a model that has one);
* the user's own ``torch.nn.utils.clip_grad_norm_(model.parameters(), c)`` and
  ``torch.nn.utils.get_total_norm``: the sharded model's gradients carry a mark whose
  ``__torch_function__`` hands torch's total norm to :func:`grad_norm` (``shardcore.grad_mark``;
  nothing of torch is replaced; why not DTensor parameters: docs/parameters.md). A sharded model's
  gradients mixed with other tensors are refused by name (:func:`owner`).

Every rank of the replica must call it (it is a collective, bounded like every shardcore
collective); a call on one rank only ends in :class:`~shardcore.CollectiveTimeout` naming it.
"""

from __future__ import annotations

import math
import types
import weakref
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from .attach import attached
from .data_parallel import dp_shard_group, reshard
from .distributed.collectives import all_reduce, group_key, group_rank, group_size
from .sharded_state import parameter_specs

__all__ = [
    "clip_grad_norm_",
    "grad_norm",
    "like_grads",
    "owner",
    "register_model",
    "sharded_models",
]

#: The live sharded models (optimize registers each): what torch's norm looks gradients up in.
_MODELS: weakref.WeakSet = weakref.WeakSet()
_WHERE = "gradient norm (clip_grad_norm_): every rank of the model must call it"


def sharded_models() -> list[nn.Module]:
    """The sharded models alive in this process (each registered by ``optimize``)."""
    return list(_MODELS)


def register_model(model: nn.Module) -> None:
    """Make ``model``'s gradients known to torch's norm (``shardcore.grad_mark``) and give the
    model a ``clip_grad_norm_(max_norm, norm_type=2.0)`` method. Called by ``optimize``."""
    _MODELS.add(model)
    clip = types.MethodType(_clip, model)
    attached(model).route(
        model, "clip_grad_norm_", "sharded_norm", lambda inner: clip, what="the unsharded model's norm, clipped"
    )


def _clip(model: nn.Module, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
    """``model.clip_grad_norm_(max_norm, norm_type=2.0)``: :func:`clip_grad_norm_` of the model."""
    return clip_grad_norm_(model, max_norm, norm_type, error_if_nonfinite=error_if_nonfinite)


def _row_weights(spec, rank: int, copies: float, like: torch.Tensor) -> torch.Tensor | None:
    """``1 / copies`` per row of a rank's slice along ``spec.dim`` (0 for padding rows), or
    ``None`` when every row counts ``1 / copies`` (no replicated segment, no padding)."""
    ranges = spec.ranges(rank)
    if not spec.is_replicated and not any(pad for _, _, pad in ranges):
        return None
    parts = []
    for seg, (start, stop, pad) in zip(spec.segments, ranges, strict=True):
        parts += [1.0 / (copies * spec.replica_blocks(seg))] * (stop - start) + [0.0] * pad
    return torch.tensor(parts, dtype=torch.float32, device=like.device)


def _local(grad: torch.Tensor, weights: torch.Tensor | None, dim: int):
    """This rank's own entries of ``grad`` and the row weights that apply to them: an FSDP
    DTensor gradient is this rank's data-parallel shard, whose rows are cut from the weights."""
    from torch.distributed.tensor import DTensor

    if not isinstance(grad, DTensor):
        return grad, weights
    local = grad.to_local()
    if weights is not None:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(grad.shape, grad.device_mesh, grad.placements)
        weights = weights.narrow(0, offset[dim], shape[dim])
    return local, weights


def _entry_sum(grad: torch.Tensor, weights, scale: float, dim: int, norm_type: float) -> torch.Tensor:
    """This rank's weighted ``sum |g| ** p`` (or max ``|g|`` for the infinity norm), in float32."""
    g = grad.detach().float().abs()
    if norm_type == math.inf:
        if weights is not None:
            shape = [1] * g.dim()
            shape[dim] = -1
            g = g * (weights.view(shape) > 0)
        return g.amax() if g.numel() else g.new_zeros(())
    g = g.pow(norm_type) if norm_type != 1.0 else g
    if weights is None:
        return g.sum() * scale
    other = [d for d in range(g.dim()) if d != dim]
    per_row = g.sum(dim=other) if other else g
    return (per_row * weights).sum()


def _replica_groups(info, group, *, main: bool) -> list:
    """The groups whose ranks hold disjoint parts of one model replica (size > 1 only): ``group``
    (the tensor-parallel one, or the experts'), sp, pp and, for the main sums under FSDP, dp (expert
    parameters stay whole under FSDP: the experts' group spans their data-parallel ranks)."""
    layout = info.layout
    groups = [group]
    groups += [layout.group(d) for d in ("sp", "pp") if getattr(layout, d) > 1]
    if main and info.data_parallel is not None:
        groups.append(dp_shard_group(info.config, layout))  # None under DDP: its replicas are equal
    return [g for g in groups if g is not None and group_size(g) > 1]


def grad_norm(
    model: nn.Module,
    parameters: Iterable[torch.Tensor] | None = None,
    norm_type: float = 2.0,
    *,
    error_if_nonfinite: bool = False,
) -> torch.Tensor:
    """The norm of the unsharded model's gradient (of ``parameters``, default all of ``model``'s),
    from the slices every rank holds: a collective over the ranks of one model replica."""
    info = getattr(model, "shardcore", None)
    if info is None:
        raise TypeError(f"{type(model).__name__} is not sharded by shardcore (optimize it first)")
    norm_type = float(norm_type)
    if norm_type <= 0:
        raise ValueError(f"clip_grad_norm_: norm_type={norm_type:g} is not supported; use a p > 0 or inf")
    chosen = None if parameters is None else {id(p) for p in parameters}
    specs = parameter_specs(reshard(model))
    tp = group_size(info.process_group)
    copies = float(tp * info.layout.sp)
    tied = {name: group_size(g) for name, g in getattr(info.pipeline, "tied", [])}
    # the sums per group whose ranks hold disjoint parts: the tensor-parallel one, and the experts'
    # (expert parallelism: ep x tp ranks hold one copy of every expert, the data-parallel ranks the rest)
    buckets = {group_key(info.process_group): (info.process_group, [])}
    for _spec, group in specs.values():
        buckets.setdefault(group_key(group), (group, []))
    device = None
    for name, p in model.named_parameters():
        if p.grad is None or (chosen is not None and id(p) not in chosen):
            continue
        spec, group = specs.get(name, (None, info.process_group))
        n = (copies / tp if spec is not None else copies) * tied.get(name, 1)  # copies besides the spec's
        weights = _row_weights(spec, group_rank(group), n, p.grad) if spec is not None else None
        dim = spec.dim if spec is not None else 0
        local, weights = _local(p.grad, weights, dim)
        buckets[group_key(group)][1].append(_entry_sum(local, weights, 1.0 / n, dim, norm_type))
        device = local.device
    if device is None:  # no gradient here: still take part in the collectives
        device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    inf = norm_type == math.inf
    op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
    totals = []
    for i, (group, sums) in enumerate(buckets.values()):
        total = torch.stack(sums).amax() if inf and sums else torch.stack(sums).sum() if sums else None
        total = torch.zeros((), device=device) if total is None else total.to(device)
        for g in _replica_groups(info, group, main=i == 0):
            all_reduce(total, g, op, where=_WHERE)
        totals.append(total)
    total = torch.stack(totals).amax() if inf else torch.stack(totals).sum()
    total = total if inf else total.pow(1.0 / norm_type)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients of the sharded {type(model).__name__} is "
            "non-finite, so it cannot be clipped; set error_if_nonfinite=False to scale by it anyway"
        )
    return total


def clip_grad_norm_(
    model_or_parameters,
    max_norm: float,
    norm_type: float = 2.0,
    *,
    error_if_nonfinite: bool = False,
) -> torch.Tensor:
    """Scale the gradients so that the unsharded model's gradient norm is at most ``max_norm``;
    return that norm (before clipping). ``model_or_parameters``: a sharded model, or parameters of
    one (``model.parameters()``, as with torch's ``clip_grad_norm_``). Every rank must call it."""
    if isinstance(model_or_parameters, nn.Module):
        model, params = model_or_parameters, [p for p in model_or_parameters.parameters() if p.grad is not None]
    else:
        params = [p for p in model_or_parameters if p.grad is not None]
        model, _ = owner([p.grad for p in params])
        if model is None:
            raise TypeError(
                "shardcore.clip_grad_norm_: these parameters belong to no model sharded by shardcore.optimize; "
                "use torch.nn.utils.clip_grad_norm_ for them"
            )
    grads = [p.grad for p in params]
    total = like_grads(grad_norm(model, params, norm_type, error_if_nonfinite=error_if_nonfinite), grads)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def like_grads(total: torch.Tensor, grads: list) -> torch.Tensor:
    """``total`` as torch's clipping multiplies it into ``grads``: a replicated DTensor on their
    mesh when they are FSDP DTensors, else as it is."""
    from torch.distributed.tensor import DTensor, Replicate

    first = next((g for g in grads if isinstance(g, DTensor)), None)
    if first is None:
        return total
    return DTensor.from_local(total, first.device_mesh, [Replicate()] * first.device_mesh.ndim, run_check=False)


def owner(tensors: list, others: int = 0) -> tuple[nn.Module | None, list]:
    """The live sharded model whose gradients ``tensors`` are, and its parameters holding them;
    refused when they come with ``others`` (or some of ``tensors``) that are not its gradients."""
    ids = {id(t) for t in tensors}
    for model in list(_MODELS):
        params = [p for p in model.parameters() if p.grad is not None and id(p.grad) in ids]
        if not params:
            continue
        extra = len(ids) - len(params) + others
        if extra:
            raise ValueError(
                f"torch.nn.utils.clip_grad_norm_ / get_total_norm got gradients of the sharded {type(model).__name__} "
                f"together with {extra} other tensor(s) (not its gradients, or gradients replaced after the backward): "
                "their norm has no single meaning across ranks. Clip the sharded model's parameters alone "
                "(model.parameters()), or call shardcore.clip_grad_norm_(model, max_norm) and clip the others separately."
            )
        return model, params
    return None, []
