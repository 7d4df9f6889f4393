"""How the kits compare parameters after optimizer steps with the unsharded model's: within
:data:`~.tolerance.STEP` of the update's own size (the reference's largest move of any element),
gathered and as each rank holds them; and :func:`assert_trained_close` for a test's own loop."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from .compare import _declared_zero, _held_part, _local
from .structure import local_expected
from .tolerance import STEP, Tolerance, within


def update_size(ref_params: Mapping[str, torch.Tensor], before: Mapping[str, torch.Tensor]) -> float:
    """The update's own size: the largest move of any element of the reference model between
    ``before`` and now (:data:`~.tolerance.STEP` scales with it)."""
    moves = (((p.detach() - before[n]).abs().max().item() if p.numel() else 0.0) for n, p in ref_params.items())
    return max(moves, default=0.0)


def step_bound(update: float, rtol: float = STEP.rtol) -> float:
    """How far a parameter may be from the reference's after optimizer steps whose largest move of
    any element was ``update``: :data:`~.tolerance.STEP` with ``rtol``."""
    return Tolerance(rtol=rtol, atol=STEP.atol).bound(update)


def assert_trained_close(
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    before: Mapping[str, torch.Tensor],
    what: str,
    rtol: float = STEP.rtol,
) -> float:
    """Parameters trained by the user's own loop (``got``, full tensors by name) against the unsharded
    model trained alike (``want``), within ``rtol`` (:data:`~.tolerance.STEP`) of the update's own size
    (``want``'s largest move since ``before``, its weights before training); returns the largest difference."""
    update = update_size(want, before)
    bound = step_bound(update, rtol)
    worst = 0.0
    for name, tensor in got.items():
        diff = (tensor.detach() - want[name].detach()).abs().max().item() if tensor.numel() else 0.0
        message = (
            f"{name} {what}: max abs diff {diff:.3g} > {bound:.3g} (of an update whose largest move is {update:.3g})"
        )
        worst = max(worst, within("step", diff, bound, message))
    return worst


def _step_bound(name: str, rtol: float, update: float, zero_grads: tuple[str, ...]) -> float:
    # a gradient that is fp32 noise turns into AdamW steps of up to lr * noise / eps each,
    # different noise in the two runs: 10x the tolerance for parameters declared zero
    return step_bound(update, rtol) * (10 if _declared_zero(name, zero_grads) else 1)


def _step_message(name: str, steps: int, diff: float, bound: float, update: float, where: str = "") -> str:
    return (
        f"parameter {name} after {steps} AdamW steps{where}: max abs diff {diff:.3g} > {bound:.3g} "
        f"(of an update whose largest move is {update:.3g})"
    )


def _check_gathered_params(
    model: nn.Module, expected: Mapping, steps: int, rtol: float, update: float, zero_grads=()
) -> float:
    """Every parameter of ``model``, gathered (:func:`shardcore.full_named_tensors`), against
    ``expected[name]`` after ``steps`` optimizer steps whose largest move was ``update``; returns
    the largest difference."""
    import shardcore

    worst = 0.0
    for name, full in shardcore.full_named_tensors(model):
        bound = _step_bound(name, rtol, update, zero_grads)
        diff = (full - expected[name].detach()).abs().max().item()
        worst = max(worst, within("step", diff, bound, _step_message(name, steps, diff, bound, update)))
    return worst


def _check_local_params(
    model: nn.Module, ref_params: Mapping[str, torch.Tensor], steps: int, rtol: float, update: float, zero_grads=()
) -> float:
    """Every parameter as this rank holds it against the same part of the unsharded one after ``steps``."""
    expected = local_expected(model, {n: p.detach() for n, p in ref_params.items()})
    worst = 0.0
    for name, param in model.named_parameters():
        bound = _step_bound(name, rtol, update, zero_grads)
        mine, want = _local(param.detach()), _held_part(param, expected[name])
        if mine.shape != want.shape:
            raise AssertionError(
                f"parameter {name}: this rank holds shape {tuple(mine.shape)}, its part is {tuple(want.shape)}"
            )
        diff = (mine - want).abs().max().item() if mine.numel() else 0.0
        message = _step_message(name, steps, diff, bound, update, ", this rank's slice")
        worst = max(worst, within("step", diff, bound, message))
    return worst


def _check_params_after(
    model: nn.Module, ref_params: Mapping, steps: int, rtol: float, before: Mapping, zero_grads=()
) -> float:
    """Every parameter after ``steps`` optimizer steps, gathered and as this rank's slice, within
    ``rtol`` of the update's own size (the reference's largest move since ``before``, its
    :func:`snapshot` before the steps)."""
    update = update_size(ref_params, before)
    worst = _check_gathered_params(model, ref_params, steps, rtol, update, zero_grads)
    return max(worst, _check_local_params(model, ref_params, steps, rtol, update, zero_grads))
