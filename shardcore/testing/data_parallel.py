"""The conformance check for data parallelism (``ShardConfig(data_parallel="fsdp" | "ddp")``): each
data-parallel rank trains on its part of the batch; the whole must train like the unsharded model
on the whole batch."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..data_parallel import SHARDED_MODES
from ..distributed.collectives import all_reduce, broadcast
from .compare import (
    _backward_loss,
    _build_pair,
    _check_every_grad,
    _check_loss,
    _grad_check,
    _later_losses,
    _train_side_by_side,
)
from .steps import _check_params_after
from .tolerance import GRAD, GRAD_FLOOR, LOSS, LOSS_LATER, STEP

__all__ = ["assert_data_parallel_matches", "dp_part", "state_bytes"]


def dp_part(inputs: Mapping[str, Any], dp_rank: int, dp_size: int) -> dict[str, Any]:
    """This data-parallel rank's part of a global batch: every tensor split evenly along its first
    (batch) dimension, rank ``i`` taking the ``i``-th part; other values passed as they are."""
    out = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            if value.shape[0] % dp_size:
                raise ValueError(
                    f"input {key!r} has batch size {value.shape[0]}, not divisible by data_parallel_size={dp_size}"
                )
            value = value.chunk(dp_size)[dp_rank]
        out[key] = value
    return out


def _data_parallel_part(model: nn.Module, batch: Mapping[str, Any], report: dict):
    """``(this rank's part of batch, the mean of a loss over the data-parallel ranks)``: the whole
    batch and the loss itself without data parallelism."""
    layout, mode = model.shardcore.layout, model.shardcore.data_parallel
    report["data_parallel"] = mode
    if mode is None or layout.dp == 1:
        return batch, lambda loss: loss

    def mean(loss: torch.Tensor) -> torch.Tensor:  # each rank's loss on its part: their mean is the whole batch's
        total = all_reduce(loss.detach().clone(), layout.group("dp"), where="the kit: the loss's mean over dp")
        return total / layout.dp

    return dp_part(batch, layout.coordinates(dist.get_rank())["dp"], layout.dp), mean


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes of parameters and tensor optimizer state this rank holds (its shards, under FSDP)."""
    from ..data_parallel import local_nbytes, reshard

    total = sum(local_nbytes(p) for p in reshard(model).parameters())
    if optimizer is not None:
        for state in optimizer.state.values():
            total += sum(local_nbytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def assert_data_parallel_matches(
    build: Callable[[], nn.Module],
    inputs: Mapping[str, Any],
    config,
    *,
    policy=None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    seed: int = 0,
    steps: int = 3,
    lr: float = 1e-3,
    adam_eps: float = 1e-5,
    rtol_loss: float = LOSS.rtol,
    rtol_loss_steps: float = LOSS_LATER.rtol,
    grad_rtol: float = GRAD.rtol,
    grad_floor: float = GRAD_FLOOR,
    zero_grads: tuple[str, ...] = (),
    rtol_step: float = STEP.rtol,
    max_state_fraction: float | None = None,
    reference_on_parts: bool = False,
) -> dict[str, Any]:
    """Check a data-parallel (x tensor-parallel) model against the unsharded one; run on every rank.

    ``build()`` is called twice after ``torch.manual_seed(seed)``; one copy is optimized with
    ``config`` (``data_parallel`` set, ``data_parallel_size > 1``). The unsharded model runs the
    whole ``inputs``; each data-parallel rank its part (:func:`dp_part`). Then: the mean of the
    ranks' losses equals the unsharded loss (``rtol_loss``; each later step, after AdamW moved both
    by fp32 noise, ``rtol_loss_steps``; every part the same number of loss terms), every gradient
    gathered over dp and tp equals the unsharded one (relative norm) and so does each rank's part
    of it (its slice, its FSDP shard), and every parameter after ``steps`` AdamW steps (``rtol_step``
    of the update's own size, :mod:`.tolerance`), gathered and local. Names must be the unsharded
    model's. Reports ``state_fraction``: this rank's bytes of parameters and AdamW state over the
    unsharded model's (at most ``max_state_fraction`` if given).

    ``reference_on_parts=True``: the unsharded loss is the mean of its losses on the ranks' parts,
    each its own forward (DDP over the unsharded model: a router's load-balancing loss per part).
    Under expert parallelism, copies of an expert are compared over the ranks holding it.
    """
    ref, model = _build_pair(build, config, policy, seed, None)
    info, layout, ref_params = model.shardcore, model.shardcore.layout, dict(ref.named_parameters())
    _check_wrapping(info, config)
    _check_names(model, ref_params)
    report: dict[str, Any] = {"dp": layout.dp, "tp": layout.tp}
    mine, mean = _data_parallel_part(model, inputs, report)

    def first(loss, loss_ref):
        report.update(_check_loss(mean(loss), loss_ref, rtol_loss, what="mean loss over the data-parallel ranks"))
        check = _grad_check({n: p.grad for n, p in ref_params.items()}, grad_rtol, grad_floor, zero_grads)
        report["max_rel_err_grads"] = _check_every_grad(model, ref_params, check, "gathered over dp and tp")

    every = _later_losses(mean, rtol_loss_steps, "mean loss over the data-parallel ranks")
    step = functools.partial(_backward_loss, model, mine, loss_fn)
    ref_step = _reference_step(ref, inputs, loss_fn, layout.dp if reference_on_parts else 0)
    opt_ref, opt, before = _train_side_by_side(ref, model, step, ref_step, steps, first, every, lr=lr, eps=adam_eps)
    if steps:
        after = _check_params_after(model, ref_params, steps, rtol_step, before, zero_grads)
        report["max_abs_diff_after_steps"] = after
    if steps and info.data_parallel == "ddp":  # each replica holds its own copy: they must stay equal
        _check_replicas_equal(model, layout, steps)
    report.update(_state_fraction(model, ref, opt, opt_ref, max_state_fraction))
    return report


def _check_names(model: nn.Module, ref_params: Mapping) -> None:
    names = {n for n, _ in model.named_parameters()}
    if names != set(ref_params):
        raise AssertionError(
            f"parameter names differ from the unsharded model's: missing {sorted(set(ref_params) - names)}, "
            f"extra {sorted(names - set(ref_params))}"
        )


def _check_wrapping(info, config) -> None:
    """What ``optimize`` made is what ``config`` asked; under FSDP every block is its own unit."""
    if info.data_parallel != config.data_parallel:
        raise AssertionError(f"model.shardcore.data_parallel is {info.data_parallel!r}, asked {config.data_parallel!r}")
    if info.data_parallel in SHARDED_MODES:  # each block its own all-gather unit, as fully_shard per block makes it
        from torch.distributed.fsdp import FSDPModule

        loose = [name for name, block in info.policy.blocks() if not isinstance(block, FSDPModule)]
        if loose:
            raise AssertionError(f"blocks {loose} are not wrapped by fully_shard: the whole model is gathered at once")
        _check_placements(info, config)


def _check_placements(info, config) -> None:
    """Every FSDP parameter on the mesh ``config`` asks: ``dp`` (one dim, sharded), or HSDP's 2-D mesh
    (replicated over ``dp_replicate``, sharded over ``data_parallel_shard_size`` ranks); ZeRO-2 keeps
    the weights gathered after forward, FSDP does not."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Replicate

    hsdp, config = config.data_parallel == "hsdp", info.config  # as optimize completed it (a mesh's sizes)
    for name, param in info.policy.model.named_parameters():
        if not isinstance(param, DTensor):
            continue
        mesh, kinds = param.device_mesh, param.placements
        want = (config.data_parallel_shard_size,) if hsdp else (mesh.size(),)
        if hsdp and (mesh.ndim != 2 or not isinstance(kinds[0], Replicate) or tuple(mesh.shape[1:]) != want):
            raise AssertionError(f"{name}: HSDP wants a (replicate, shard={want[0]}) mesh, it is on {mesh} as {kinds}")
        if not hsdp and mesh.ndim != 1:
            raise AssertionError(f"{name}: {config.data_parallel} wants the 1-D dp mesh, it is on {mesh}")
    groups = [b._get_fsdp_state()._fsdp_param_group for _, b in info.policy.blocks() if isinstance(b, FSDPModule)]
    keeps = {g.post_forward_mesh_info is None for g in groups if g is not None}  # no resharding after forward
    if keeps != {config.data_parallel == "zero2"}:
        raise AssertionError(f"data_parallel={config.data_parallel!r}: weights kept gathered after forward: {keeps}")


def _reference_step(ref: nn.Module, inputs: Mapping[str, Any], loss_fn, parts: int):
    """The unsharded model's step: on the whole batch, or (``parts``) the mean over the parts."""
    if parts:
        return functools.partial(_backward_mean_of_parts, ref, inputs, loss_fn, parts)
    return functools.partial(_backward_loss, ref, inputs, loss_fn)


def _backward_mean_of_parts(model: nn.Module, inputs: Mapping[str, Any], loss_fn, parts: int) -> torch.Tensor:
    """The mean of ``model``'s losses on the ``parts`` parts of ``inputs``, each its own forward; backward."""
    from .compare import _loss

    loss = sum(_loss(model(**dp_part(inputs, i, parts)), loss_fn) for i in range(parts)) / parts
    loss.backward()
    return loss


def _check_replicas_equal(model: nn.Module, layout, steps: int) -> None:
    """Every data-parallel replica holds the same parameters; an expert-parallel expert is compared
    over the ranks holding the same experts (``dp / ep`` of them) instead."""
    from ..expert_parallel import expert_modules

    experts = {id(p) for m in expert_modules(model) for p in m.parameters()}
    groups = {False: layout.group("dp"), True: layout.expert_groups()[2] if layout.ep > 1 else None}
    for name, param in model.named_parameters():
        group = groups[id(param) in experts]
        if group is None or dist.get_world_size(group) == 1:
            continue
        local = param.detach()
        first = broadcast(local.clone(), group, where="the kit: the first replica's parameters")
        if not torch.equal(first, local):
            raise AssertionError(f"parameter {name}: the data-parallel replicas drifted apart after {steps} steps")


def _state_fraction(model, ref, opt, opt_ref, max_state_fraction: float | None) -> dict[str, Any]:
    """This rank's bytes of parameters and AdamW state over the unsharded model's."""
    mine_bytes, full_bytes = state_bytes(model, opt), state_bytes(ref, opt_ref)
    fraction = mine_bytes / full_bytes
    if max_state_fraction is not None and not fraction <= max_state_fraction:
        raise AssertionError(
            f"this rank holds {mine_bytes} bytes of parameters and optimizer state, "
            f"{fraction:.3f} of the unsharded {full_bytes}, above {max_state_fraction}"
        )
    return {"state_bytes": mine_bytes, "state_bytes_unsharded": full_bytes, "state_fraction": fraction}
