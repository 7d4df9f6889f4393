"""The conformance check for gradient clipping: the user's own ``torch.nn.utils.clip_grad_norm_``
on a sharded model gives the unsharded model's norm and clipped gradients, for every layout."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils.clip_grad import clip_grad_norm_ as _bound_before_optimize  # as `from ... import` users do

from .compare import _check_grads, _loss, snapshot
from .data_parallel import dp_part
from .steps import _check_gathered_params, update_size
from .tolerance import GRAD, GRAD_FLOOR, NORM, STEP, within

__all__ = ["CLIP_CALLS", "assert_clipping_matches", "exact_norm"]

#: How a user clips: the ways in that :func:`assert_clipping_matches` checks.
CLIP_CALLS = ("torch", "torch_bound_early", "model_method", "shardcore", "shardcore_parameters")


def _clip(model: nn.Module, how: str, max_norm: float, norm_type: float) -> torch.Tensor:
    import shardcore

    if how == "torch":  # the line every training script has
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=norm_type)
    if how == "torch_bound_early":  # `from torch.nn.utils import clip_grad_norm_` before shardcore
        return _bound_before_optimize(model.parameters(), max_norm, norm_type=norm_type)
    if how == "model_method":  # what accelerate calls for a model that has one
        return model.clip_grad_norm_(max_norm, norm_type=norm_type)
    if how == "shardcore":
        return shardcore.clip_grad_norm_(model, max_norm, norm_type=norm_type)
    if how == "shardcore_parameters":
        return shardcore.clip_grad_norm_(model.parameters(), max_norm, norm_type=norm_type)
    raise ValueError(f"unknown clip call {how!r}; one of {CLIP_CALLS}")


def _sharded_backward(model: nn.Module, batch: Mapping[str, Any], loss_fn) -> None:
    """One forward and backward as the user runs it for the model's layout."""
    import shardcore

    info = model.shardcore
    if info.data_parallel is not None:
        batch = dp_part(batch, info.layout.coordinates(dist.get_rank())["dp"], info.layout.dp)
    if info.pipeline is not None:
        shardcore.pipeline_step(model, batch)
        return
    _loss(model(**batch), loss_fn).backward()


def assert_clipping_matches(
    build: Callable[[], nn.Module],
    batch: Mapping[str, Any],
    config,
    *,
    how: str = "torch",
    norm_type: float = 2.0,
    clip_fraction: float = 0.5,
    policy=None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    seed: int = 0,
    lr: float = 0.1,
    rtol_norm: float = NORM.rtol,
    grad_rtol: float = GRAD.rtol,
    grad_floor: float = GRAD_FLOOR,
    zero_grads: tuple[str, ...] = (),
    rtol_step: float = STEP.rtol,
) -> dict[str, Any]:
    """Clip a sharded model's gradients the user's way (``how``, one of :data:`CLIP_CALLS`) and
    compare with the unsharded model clipped by its norm summed in float64 (:func:`exact_norm`; torch's
    ``clip_grad_norm_`` sums in float32); run on every rank.

    ``build()`` is called twice after ``torch.manual_seed(seed)``; one copy is optimized with
    ``config``. Both run one backward on ``batch`` (the sharded one as its layout runs: its
    data-parallel part under FSDP/DDP, :func:`shardcore.pipeline_step` under pipeline stages).
    ``max_norm`` is ``clip_fraction`` of the unsharded norm, so the clip acts. Then: the norm
    returned on every rank equals the unsharded one (relative ``rtol_norm``), every clipped
    gradient gathered over the model's ranks equals the unsharded clipped gradient, and so does
    every parameter after one SGD step (``lr``; ``rtol_step`` of the step's own size,
    :mod:`.tolerance`). Reports both norms.
    """
    import shardcore

    torch.manual_seed(seed)
    ref = build()
    torch.manual_seed(seed)
    model = shardcore.optimize(build(), config, policy=policy)
    ref_named = dict(ref.named_parameters(remove_duplicate=False))
    _loss(ref(**batch), loss_fn).backward()
    _sharded_backward(model, batch, loss_fn)

    held = [p for p in ref.parameters() if p.grad is not None]
    want = exact_norm([p.grad for p in held], norm_type)  # torch's own, summed in float32, can miss (exact_norm)
    max_norm = clip_fraction * want.item()
    torch.nn.utils.clip_grads_with_norm_(held, max_norm, want.float())
    got = _clip(model, how, max_norm, norm_type)
    got = got.full_tensor() if hasattr(got, "full_tensor") else got
    report = _check_norm(got, want, f"clip_grad_norm_ ({how}, norm_type={norm_type:g})", rtol_norm)
    ref_grads = {n: p.grad for n, p in ref_named.items()}
    scale = max((g.double().norm().item() for g in ref_grads.values() if g is not None), default=0.0)
    pairs = [(n, g, ref_grads[n]) for n, g in shardcore.full_named_tensors(model, grads=True)]
    check = {"scale": scale, "rtol": grad_rtol, "floor": grad_floor, "zero_grads": zero_grads}
    report["max_rel_err_clipped_grads"] = _check_grads(pairs, where=f"clipped ({how})", **check)
    before = snapshot(ref)
    for opt in (torch.optim.SGD(ref.parameters(), lr=lr), torch.optim.SGD(model.parameters(), lr=lr)):
        opt.step()
    update = update_size(ref_named, before)
    report["max_abs_diff_after_step"] = _check_gathered_params(model, ref_named, 1, rtol_step, update, zero_grads)
    return report


def exact_norm(grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The total ``norm_type``-norm of ``grads`` summed in float64 (each tensor upcast in turn): the unsharded
    reference. torch's float32 norm of one large tensor misses by more than the kit's tolerances on some CPUs
    (AVX2: 2.5e-4 at 8M entries, a large vocabulary head's), where a sharded norm sums slices accurately."""
    norms = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float64) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms), norm_type) if norms else torch.zeros((), dtype=torch.float64)


def _check_norm(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float) -> dict[str, Any]:
    """The norm a clipping call returned on this rank against the unsharded one (relative ``rtol``);
    the report's norm entries."""
    rel = abs(got.item() - want.item()) / max(want.item(), 1e-12)
    message = (
        f"{what} on rank {dist.get_rank()}: norm {got.item():.9g} vs unsharded {want.item():.9g}, "
        f"relative diff {rel:.3g} > {rtol}"
    )
    within("gradient norm", rel, rtol, message)
    return {"norm": got.item(), "norm_unsharded": want.item(), "norm_rel_diff": rel}
