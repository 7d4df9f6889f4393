"""What each rank of ``shardcore check`` does: the unsharded model and the sharded one built alike,
``steps`` training steps side by side as the user runs them (``pipeline_step`` over this rank's
data-parallel part of the batch, ``torch.nn.utils.clip_grad_norm_``, AdamW), and the numbers the
card compares: the losses, every gradient this rank holds (gathered over its slices), the clipped
norm, the parameters after the steps, the collectives that ran."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..cost.auto import optimize
from ..distributed.collectives import count_collectives
from ..pipeline import pipeline_step
from ..sharded_state import full_named_tensors
from ..testing import count_c10d_calls, dp_part, exact_norm
from ..testing.compare import snapshot
from ..testing.steps import update_size
from ..testing.varied import without_constant_parameters
from .parts import name_groups, parts_of
from .source import ModelSource

__all__ = ["rank_numbers"]


def _step_loss(model: nn.Module, batch: dict, loss_fn) -> torch.Tensor:
    """The loss of ``model`` on ``batch``: its own (the output's ``loss``), or with ``loss_fn`` (a model without
    one) ``loss_fn(model(**inputs), labels)``, the batch's ``labels`` kept out of the model's inputs."""
    if loss_fn is None:
        return _loss(model(**batch))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return loss_fn(model(**inputs), batch.get("labels"))


def _loss(output: Any) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise ValueError(
            "check: the model's output has no loss; give a batch with labels (or a model class with a head)"
        )
    return loss


def _parts(batch: Mapping[str, Any] | list, dp: int) -> list[dict]:
    """The data-parallel parts of ``batch``: the given list of per-rank batches (uneven ones: an
    image on one rank only), else the batch cut evenly (:func:`~shardcore.testing.dp_part`)."""
    if isinstance(batch, list):
        return [dict(b) for b in batch]
    return [dp_part(batch, i, dp) for i in range(dp)]


def _mine(model: nn.Module, batch: Mapping[str, Any] | list) -> tuple[dict, list[dict]]:
    """This rank's part of ``batch`` and every data-parallel part (the unsharded model's inputs)."""
    info = model.shardcore
    dp = info.layout.dp if info.data_parallel is not None else 1
    parts = _parts(batch, dp)
    return parts[info.layout.coordinates(dist.get_rank())["dp"] if dp > 1 else 0], parts


def _reference_clip(ref: nn.Module, max_norm: float) -> torch.Tensor:
    """The unsharded model's gradient norm, clipped by as ``clip_grad_norm_`` clips, but summed in float64:
    torch's float32 norm of one large tensor is off by more than the card's tolerance on some CPUs (AVX2:
    2.5e-4 of the norm at 8M entries, a 32000-row head's), where the sharded norm sums slices accurately."""
    params = [p for p in ref.parameters() if p.grad is not None]
    total = exact_norm([p.grad for p in params])
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total.float())
    return total


def _reference_loss(ref: nn.Module, parts: list[dict], loss_fn=None) -> torch.Tensor:
    """The unsharded model's loss as data parallelism averages it: the mean of its parts' losses."""
    loss = sum(_step_loss(ref, part, loss_fn) for part in parts) / len(parts)
    loss.backward()
    return loss


def _gradient_errors(model: nn.Module, ref: nn.Module, floor: float) -> dict[str, float]:
    """``{name: ||g - g_ref|| / max(||g_ref||, floor x the largest ||g_ref||)}`` for every gradient
    this rank holds, gathered over its slices (a collective: every rank iterates to the end);
    ``inf`` where one side has a gradient and the other none."""
    ref_grads = {n: p.grad for n, p in ref.named_parameters(remove_duplicate=False)}
    scale = max((g.double().norm().item() for g in ref_grads.values() if g is not None), default=0.0)
    out = {}
    for name, grad in full_named_tensors(model, grads=True):
        want = ref_grads.get(name)
        if (grad is None) != (want is None) or (grad is not None and grad.shape != want.shape):
            out[name] = float("inf")
        elif grad is not None:
            err = (grad.double() - want.double()).norm().item()
            out[name] = err / max(want.double().norm().item(), floor * scale, 1e-30)
    return out


def _parameter_errors(model: nn.Module, ref: nn.Module, before: Mapping[str, torch.Tensor]) -> tuple[dict, float]:
    """``({name: max |p - p_ref|}, the update's size)``: every parameter this rank holds, gathered,
    against the unsharded model's after the steps; the size is the reference's largest move."""
    ref_params = dict(ref.named_parameters(remove_duplicate=False))
    update = update_size(ref_params, before)
    out = {}
    for name, tensor in full_named_tensors(model):
        want = ref_params.get(name)
        if want is None or tensor.shape != want.shape:
            out[name] = float("inf")
        else:
            out[name] = (tensor.double() - want.detach().double()).abs().max().item()
    return out, update


@contextlib.contextmanager
def _counted(out: dict) -> Iterator[None]:
    """Add the collectives issued inside the block to ``out``: shardcore's own (by kind) and every
    ``torch.distributed`` call (FSDP's, DDP's, the pipeline schedule's included)."""
    with count_collectives() as ours, count_c10d_calls() as calls:
        yield
    for key, counts in (("collectives", ours), ("torch_calls", calls)):
        for kind, n in counts.items():
            out[key][kind] = out[key].get(kind, 0) + n


def rank_numbers(source: ModelSource, config, batch: dict | list, *, steps: int, max_norm: float,
                 seed: int, lr: float, floor: float, loss_fn=None) -> dict[str, Any]:  # fmt: skip
    """One rank's numbers for the card (run on every rank by :func:`shardcore.check`); ``loss_fn``: the loss of a
    model without one (:func:`_step_loss`; no pipeline: ``check`` refuses the two together)."""
    _, build, _ = source.plan()
    torch.manual_seed(seed)
    ref = without_constant_parameters(build(), seed)
    torch.manual_seed(seed)
    try:  # optimize refuses before any collective, on every rank alike: the refusal is the verdict
        model = optimize(without_constant_parameters(build(), seed), config)
    except (ValueError, TypeError, NotImplementedError, LookupError) as err:
        return {"refused": f"{type(err).__name__}: {err}"}
    mine, parts = _mine(model, batch)
    before = snapshot(ref)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=lr, eps=1e-5)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-5)
    out: dict[str, Any] = {"losses": [], "norms": [], "parts": parts_of(ref), "collectives": {}, "torch_calls": {}}
    for step in range(steps):
        with _counted(out):
            opt.zero_grad()
            opt_ref.zero_grad()
            if loss_fn is None:
                loss = pipeline_step(model, mine)
            else:
                loss = _step_loss(model, mine, loss_fn)
                loss.backward()
            loss_ref = _reference_loss(ref, parts, loss_fn)
        out["losses"].append((loss.item(), loss_ref.item()))
        if step == 0:  # the check's own gathers, not counted
            out["gradients"] = _gradient_errors(model, ref, floor)
        with _counted(out):
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # the user's own line
            norm_ref = _reference_clip(ref, max_norm)
            opt.step()
            opt_ref.step()
        out["norms"].append((norm.item(), norm_ref.item()))
    out["parameters"], out["update"] = _parameter_errors(model, ref, before)
    out["coordinates"] = model.shardcore.layout.coordinates(dist.get_rank())
    out["held"] = sorted({n for n, _ in model.named_parameters()})
    out["all"] = name_groups(ref)
    return out
