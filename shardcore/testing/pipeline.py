"""The conformance check for pipeline parallelism: :func:`shardcore.pipeline_step` on a
pipelined (x tensor-parallel) model trains like the unsharded model on the whole batch."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..distributed.objects import all_gather_object
from ..pipeline import pipeline_step
from .compare import (
    _build_pair,
    _check_grads,
    _check_local_grads,
    _check_loss,
    _grad_check,
    _later_losses,
    _train_side_by_side,
    output_close,
)
from .data_parallel import _data_parallel_part
from .steps import _check_params_after
from .tolerance import GRAD, GRAD_FLOOR, LOSS, LOSS_LATER, STEP

__all__ = ["assert_pipeline_matches"]


def assert_pipeline_matches(
    build: Callable[[], nn.Module],
    batch: Mapping[str, Any],
    config,
    *,
    policy=None,
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
    reference_loss: Callable[[nn.Module, Mapping[str, Any]], torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Check a pipelined model against the unsharded one; run on every rank of the world.

    ``build()`` is called twice after ``torch.manual_seed(seed)``; one copy is optimized with
    ``config`` (``pipeline_parallel_size > 1``). Both take the whole ``batch`` (under data parallelism
    each data-parallel rank its part, :func:`~shardcore.testing.dp_part`, every part the same number
    of loss terms, and the mean of their losses counts): the loss :func:`shardcore.pipeline_step`
    returns on every rank must equal the unsharded model's (relative ``rtol_loss``, each later step
    ``rtol_loss_steps``; ragged label counts over the microbatches included); every gradient this
    rank holds, gathered over its tensor-parallel group and as its own slice, must match (relative
    norm ``grad_rtol``; gathered also element by element, within ``grad_rtol`` of the gradient's
    largest element); so must every held parameter after ``steps`` AdamW steps (``rtol_step`` of
    the update's own size, :mod:`.tolerance`), gathered and local. Every held name
    must be the unsharded model's, and every unsharded parameter held by some rank.
    ``reference_loss(model, batch)`` is the unsharded model's loss (default ``model(**batch).loss``;
    a model that takes no labels, timm's, says how its loss is computed).
    """
    ref, model = _build_pair(build, config, policy, seed, None)
    info = model.shardcore.pipeline
    if info is None:
        raise AssertionError("the model has no pipeline: give the config pipeline_parallel_size > 1")
    ref_named = dict(ref.named_parameters(remove_duplicate=False))  # tied weights under each of their names
    held = _check_names(model, ref_named)
    report: dict[str, Any] = {"stages": info.stage_indices, "schedule": info.schedule_name, "held": len(held)}
    mine, mean_over_dp = _data_parallel_part(model, batch, report)

    def ref_step():
        loss = reference_loss(ref, batch) if reference_loss is not None else ref(**batch).loss
        loss.backward()
        return loss

    def first(loss, loss_ref):
        report.update(_check_loss(mean_over_dp(loss), loss_ref, rtol_loss, what="pipeline_step loss"))
        check = _grad_check({n: p.grad for n, p in ref_named.items()}, grad_rtol, grad_floor, zero_grads)
        report["max_rel_err_grads"] = _check_held_grads(model, ref_named, held, check)

    step = functools.partial(pipeline_step, model, mine)  # forward and backward over the microbatches
    every = _later_losses(mean_over_dp, rtol_loss_steps, "pipeline_step loss")
    _, _, before = _train_side_by_side(ref, model, step, ref_step, steps, first, every, lr=lr, eps=adam_eps)
    if steps:  # no declared-zero allowance here: every parameter within rtol_step of the update
        report["max_abs_diff_after_steps"] = _check_params_after(model, ref_named, steps, rtol_step, before)
    return report


def _check_names(model: nn.Module, ref_named: Mapping[str, nn.Parameter]) -> list[str]:
    """The parameter names this rank holds: every one a name of the unsharded model, and every
    parameter of the unsharded model (under one of its tied names) held by some rank."""
    held = [n for n, _ in model.named_parameters()]
    unknown = sorted(set(held) - set(ref_named))
    if unknown:
        raise AssertionError(f"parameters named unlike the unsharded model: {unknown}")
    everyone = all_gather_object(held, where="the kit: the names each rank holds")
    somewhere = set().union(*everyone)
    aliases: dict[int, list[str]] = {}
    for n, p in ref_named.items():
        aliases.setdefault(id(p), []).append(n)
    orphans = [names[0] for names in aliases.values() if not somewhere & set(names)]
    if orphans:
        raise AssertionError(f"no rank holds {orphans}")
    return held


def _check_held_grads(model: nn.Module, ref_named: Mapping, held: list[str], check: dict) -> float:
    """Every gradient this rank holds, gathered over its tensor-parallel group (relative norm, and
    every element within ``rtol`` of the gradient's largest: one wrong element a norm would hide)
    and as its own slice."""
    import shardcore

    ref_grads = {n: p.grad for n, p in ref_named.items()}
    pairs = [(n, g, ref_grads[n]) for n, g in shardcore.full_named_tensors(model, grads=True)]
    worst = _check_grads(pairs, where="held, gathered over tp", **check)
    worst = max(worst, _check_local_grads(model, {n: ref_grads[n] for n in held}, **check))
    for name, grad, expected in pairs:
        if grad is not None:
            output_close(grad, expected, f"gradient of {name}: not close", rtol=check["rtol"], kind="gradient element")
    return worst
