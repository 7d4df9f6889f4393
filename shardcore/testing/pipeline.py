"""The conformance check for pipeline parallelism: :func:`shardcore.pipeline_step` on a
pipelined (x tensor-parallel) model trains like the unsharded model on the whole batch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .compare import _check_gathered_params, _check_grads, _check_local_grads, _check_local_params

__all__ = ["assert_pipeline_matches"]


def assert_pipeline_matches(  # noqa: PLR0915
    build: Callable[[], nn.Module],
    batch: Mapping[str, Any],
    config,
    *,
    policy=None,
    seed: int = 0,
    steps: int = 3,
    lr: float = 1e-3,
    adam_eps: float = 1e-5,
    rtol_loss: float = 1e-6,
    grad_rtol: float = 1e-4,
    grad_atol: float = 1e-6,
    grad_floor: float = 1e-5,
    zero_grads: tuple[str, ...] = (),
    atol_step: float = 1e-5,
    reference_loss: Callable[[nn.Module, Mapping[str, Any]], torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Check a pipelined model against the unsharded one; run on every rank of the world.

    ``build()`` is called twice after ``torch.manual_seed(seed)``; one copy is optimized with
    ``config`` (``pipeline_parallel_size > 1``). Both take the whole ``batch``: the loss
    :func:`shardcore.pipeline_step` returns, on every rank, must equal the unsharded model's
    (relative ``rtol_loss``; ragged label counts over the microbatches included); every gradient
    this rank holds, gathered over its tensor-parallel group and as this rank's own slice, must
    match (relative norm ``grad_rtol``; gathered also ``allclose(rtol=grad_rtol, atol=grad_atol)``);
    so must every held parameter after ``steps`` AdamW steps (``atol_step``), gathered and local. Every held parameter name must be a name of the
    unsharded model, and every parameter of the unsharded model must be held by some rank.
    ``reference_loss(model, batch)`` is the unsharded model's loss (default ``model(**batch).loss``;
    a model that takes no labels, timm's, says how its loss is computed).
    """
    import shardcore

    torch.manual_seed(seed)
    ref = build()
    torch.manual_seed(seed)
    model = shardcore.optimize(build(), config, policy=policy)
    info = model.shardcore.pipeline
    if info is None:
        raise AssertionError("the model has no pipeline: give the config pipeline_parallel_size > 1")
    ref_named = dict(ref.named_parameters(remove_duplicate=False))  # tied weights under each of their names
    held = [n for n, _ in model.named_parameters()]
    unknown = sorted(set(held) - set(ref_named))
    if unknown:
        raise AssertionError(f"parameters named unlike the unsharded model: {unknown}")
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, held)
    somewhere = set().union(*everyone)
    aliases: dict[int, list[str]] = {}
    for n, p in ref_named.items():
        aliases.setdefault(id(p), []).append(n)
    orphans = [names[0] for names in aliases.values() if not somewhere & set(names)]
    if orphans:
        raise AssertionError(f"no rank holds {orphans}")
    report: dict[str, Any] = {"stages": info.stage_indices, "schedule": info.schedule_name, "held": len(held)}

    opt_ref = torch.optim.AdamW(ref.parameters(), lr=lr, eps=adam_eps)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=adam_eps)
    for step in range(max(steps, 1)):
        opt_ref.zero_grad()
        opt.zero_grad()
        loss = shardcore.pipeline_step(model, batch)
        loss_ref = reference_loss(ref, batch) if reference_loss is not None else ref(**batch).loss
        loss_ref.backward()
        if step == 0:
            rel = abs(loss.item() - loss_ref.item()) / max(abs(loss_ref.item()), 1e-12)
            if not rel <= rtol_loss:
                raise AssertionError(
                    f"pipeline_step loss {loss.item():.9g} vs unsharded {loss_ref.item():.9g}: "
                    f"relative diff {rel:.3g} > {rtol_loss}"
                )
            report["loss"], report["loss_unsharded"], report["loss_rel_diff"] = loss.item(), loss_ref.item(), rel
            ref_grads = {n: p.grad for n, p in ref_named.items()}
            scale = max((g.double().norm().item() for g in ref_grads.values() if g is not None), default=0.0)
            gathered = dict(shardcore.full_named_tensors(model, grads=True))
            check = {"scale": scale, "rtol": grad_rtol, "floor": grad_floor, "zero_grads": zero_grads}
            pairs = [(n, g, ref_grads[n]) for n, g in gathered.items()]
            worst = _check_grads(pairs, where="held, gathered over tp", **check)
            held_ref = {n: ref_named[n].grad for n in held}
            report["max_rel_err_grads"] = max(worst, _check_local_grads(model, held_ref, **check))
            for name, grad, expected in pairs:
                if grad is not None and not torch.allclose(grad, expected, rtol=grad_rtol, atol=grad_atol):
                    diff = (grad - expected).abs().max().item()
                    raise AssertionError(f"gradient of {name}: not allclose (max abs diff {diff:.3g})")
            if steps == 0:
                break
        opt_ref.step()
        opt.step()
    if steps:  # no declared-zero allowance here: every parameter within atol_step
        worst = _check_gathered_params(model, ref_named, steps, atol_step)
        report["max_abs_diff_after_steps"] = max(worst, _check_local_params(model, ref_named, steps, atol_step))
    return report
