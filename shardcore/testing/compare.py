"""How the kits compare a sharded model with the unsharded one: model outputs at any depth,
losses, gradients by relative norm (gathered and as each rank holds them), parameters after
optimizer steps. Shared by :mod:`.conformance`, :mod:`.pipeline`, :mod:`.data_parallel` and the
other checks of :mod:`shardcore.testing`."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .agree import _on_every_rank
from .structure import local_expected
from .tolerance import OUTPUT, Tolerance, within
from .varied import without_constant_parameters


def _cache_parts(cache: Any) -> list[tuple[str, Any]] | None:
    """A HuggingFace KV cache's tensors by layer (``{layer}.keys`` / ``.values``), its two halves for
    an encoder-decoder cache; ``None`` for an object that is no cache."""
    if hasattr(cache, "self_attention_cache") and hasattr(cache, "cross_attention_cache"):
        return [("self", cache.self_attention_cache), ("cross", cache.cross_attention_cache)]
    layers = getattr(cache, "layers", None)
    if isinstance(layers, list | tuple) and all(hasattr(x, "keys") and hasattr(x, "values") for x in layers):
        return [(f"{i}.{part}", getattr(x, part)) for i, x in enumerate(layers) for part in ("keys", "values")]
    if hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):  # transformers 4.x
        return [(f"{i}.keys", k) for i, k in enumerate(cache.key_cache)] + [
            (f"{i}.values", v) for i, v in enumerate(cache.value_cache)
        ]
    return None


def _tensors(output: Any, skip: tuple[str, ...] = (), prefix: str = "") -> dict[str, torch.Tensor]:
    """The floating-point tensors of a model output, at any depth (tensors, tuples, lists, dicts,
    ModelOutputs, KV caches), keyed by their path (``"past_key_values.0.keys"``); top-level fields
    named in ``skip`` are left out. Anything else is refused by name: a field the kit cannot
    compare is never dropped silently."""
    if isinstance(output, torch.Tensor):
        return {prefix or "output": output} if output.is_floating_point() else {}
    if output is None or isinstance(output, bool | int | float | str):
        return {}
    if isinstance(output, Mapping):
        items = list(output.items())
    elif isinstance(output, tuple | list):
        items = list(enumerate(output))
    else:
        items = _cache_parts(output)
        if items is None:
            raise AssertionError(
                f"output {prefix!r} is a {type(output).__name__}, which the kit cannot compare; "
                f"leave it out with skip_outputs=({prefix.split('.')[0]!r},)"
            )
    found = {}
    for key, value in items:
        if not prefix and str(key) in skip:
            continue
        found.update(_tensors(value, prefix=f"{prefix}.{key}" if prefix else str(key)))
    return found


def _loss(output: Any, loss_fn: Callable | None) -> torch.Tensor:
    if loss_fn is not None:
        return loss_fn(output)
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise ValueError("the model output has no 'loss'; pass loss_fn=")
    return loss


def _check_outputs(out_ref: Any, out: Any, skip: tuple[str, ...], rtol: float = OUTPUT.rtol, what: str = "") -> float:
    """Every floating-point output at any depth (but the top-level fields ``skip``): same fields,
    shapes, and values within :func:`output_close` (``rtol`` of each tensor's largest element);
    returns the largest difference. ``what`` follows the field in a message (``" after lazy load"``)."""
    ref_t, got_t = _tensors(out_ref, skip), _tensors(out, skip)
    if set(ref_t) != set(got_t):
        raise AssertionError(f"output fields differ: unsharded {sorted(ref_t)} vs sharded {sorted(got_t)}")
    worst = 0.0
    for key, expected in ref_t.items():
        actual = got_t[key]
        if actual.shape != expected.shape:
            raise AssertionError(f"output {key!r}: shape {tuple(actual.shape)} != unsharded {tuple(expected.shape)}")
        worst = max(worst, output_close(actual, expected, f"output {key!r}{what}", rtol))
    return worst


def output_close(
    actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = OUTPUT.rtol, kind: str = "output"
) -> float:
    """``max |actual - expected| <= atol + rtol * max |expected|`` (:data:`~.tolerance.OUTPUT`: the
    tensor's own size scales the bound), else an ``AssertionError`` naming ``what``; returns the
    difference, its margin recorded under ``kind``. The comparison a test makes of any computed
    tensor against the unsharded one."""
    if not expected.numel():
        return 0.0
    scale = expected.detach().abs().max().item()
    diff = (actual.detach() - expected.detach()).abs().max().item()
    bound = Tolerance(rtol=rtol, atol=OUTPUT.atol).bound(scale)
    message = (
        f"{what}: max abs diff {diff:.3g} > {bound:.3g} ({OUTPUT.atol:g} + {rtol:g} x its largest element {scale:.3g})"
    )
    return within(kind, diff, bound, message)


def _check_loss(loss: torch.Tensor, loss_ref: torch.Tensor, rtol: float, what: str = "loss") -> dict[str, float]:
    """``loss`` against the unsharded ``loss_ref`` (relative ``rtol``); the report's loss entries."""
    rel = abs(loss.item() - loss_ref.item()) / max(abs(loss_ref.item()), 1e-12)
    message = f"{what} {loss.item():.9g} vs unsharded {loss_ref.item():.9g}: relative diff {rel:.3g} > {rtol}"
    within("loss", rel, rtol, message)
    return {"loss": loss.item(), "loss_unsharded": loss_ref.item(), "loss_rel_diff": rel}


def _grad_check(ref_grads: Mapping, rtol: float, floor: float, zero_grads: tuple[str, ...]) -> dict[str, Any]:
    """The keyword arguments of :func:`_check_grads`: the scale is the largest reference gradient norm."""
    scale = max((g.double().norm().item() for g in ref_grads.values() if g is not None), default=0.0)
    return {"scale": scale, "rtol": rtol, "floor": floor, "zero_grads": zero_grads}


def _declared_zero(name: str, zero_grads: tuple[str, ...]) -> bool:
    """Whether parameter ``name`` matches a ``zero_grads`` pattern (gradient zero in exact arithmetic)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in zero_grads)


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` (``inf`` for a non-zero ``actual`` against exact zeros)."""
    norm = expected.double().norm().item()
    err = (actual.double() - expected.double()).norm().item()
    if norm == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / norm


def _check_grads(pairs, *, where: str, scale: float, rtol: float, floor: float, zero_grads: tuple[str, ...]) -> float:
    """Compare ``(name, grad, expected)`` by relative norm; a gradient too small to test fails,
    unless it is declared zero in exact arithmetic (``zero_grads``): then both must be that small. A
    rank's slice may be that small (GLM's key bias past its rotary half): compared absolutely."""
    worst = 0.0
    for name, grad, expected in pairs:
        if (grad is None) != (expected is None):
            got, want = ("None" if grad is None else "set"), ("None" if expected is None else "set")
            raise AssertionError(f"gradient of {name} ({where}): sharded {got}, unsharded {want}")
        if grad is None:
            continue
        if grad.shape != expected.shape:
            raise AssertionError(
                f"gradient of {name} ({where}): shape {tuple(grad.shape)} != unsharded {tuple(expected.shape)}"
            )
        norm = expected.double().norm().item()
        if _declared_zero(name, zero_grads):
            if not (norm <= floor * scale and grad.double().norm().item() <= floor * scale):
                raise AssertionError(
                    f"gradient of {name} ({where}) was declared zero in exact arithmetic, but its norm is "
                    f"{grad.double().norm().item():.3g} (unsharded {norm:.3g}), above {floor:g} x the largest ({scale:.3g})"
                )
            continue
        small = 0.0 < norm < floor * scale
        if small and where == "this rank's slice" and (grad.double() - expected.double()).norm() <= floor * scale:
            continue
        if small:
            raise AssertionError(
                f"gradient of {name} is too small to test: norm {norm:.3g} < {floor:g} x the largest gradient norm "
                f"({scale:.3g}), at the fp32 noise floor, where a missing or sign-flipped gradient would pass; give "
                "the test model inputs and weights that reach it (or, if it is zero in exact arithmetic, list it "
                "in zero_grads=)"
            )
        rel = _rel_err(grad, expected)
        message = f"gradient of {name} ({where}): relative error {rel:.3g} > {rtol} (norm {norm:.3g})"
        within("gradient", rel, rtol, message)
        worst = max(worst, rel)
    return worst


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    """What this rank holds of ``t``: a DTensor's local shard (FSDP), else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _held_part(param: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``expected`` (its tensor-parallel slice) as ``param`` holds it: under
    FSDP (a DTensor parameter) the data-parallel shard of it, cut as ``fully_shard`` cuts it."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):  # src_data_rank=None: each rank cuts its own copy, no collective
        return distribute_tensor(expected, param.device_mesh, param.placements, src_data_rank=None).to_local()
    return expected


def _check_local_grads(model: nn.Module, ref_grads: Mapping[str, torch.Tensor | None], **check) -> float:
    """Every gradient as this rank holds it (its slice, replica copies and zero padding rows
    included; its FSDP shard of that) against the same part of the unsharded gradient."""
    local_ref = local_expected(model, {n: g for n, g in ref_grads.items() if g is not None})
    pairs = (
        (n, _local(p.grad), _held_part(p, local_ref[n]) if n in local_ref else None)
        for n, p in model.named_parameters()
    )
    return _check_grads(pairs, where="this rank's slice", **check)


def _check_every_grad(model: nn.Module, ref_params: Mapping[str, nn.Parameter], check: dict, where: str) -> float:
    """Every gradient of ``model``, gathered (under the reference's names) and as this rank's slice."""
    import shardcore

    ref_grads = {n: p.grad for n, p in ref_params.items()}
    gathered = dict(shardcore.full_named_tensors(model, grads=True))
    if set(gathered) != set(ref_params):
        raise AssertionError(
            f"parameters differ: missing {sorted(set(ref_params) - set(gathered))}, "
            f"extra {sorted(set(gathered) - set(ref_params))}"
        )
    worst = _check_grads(((n, g, ref_grads[n]) for n, g in gathered.items()), where=where, **check)
    return max(worst, _on_every_rank(lambda: _check_local_grads(model, ref_grads, **check)))


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter of ``model`` (the reference before its optimizer steps), by each of
    its names (a tied weight under every one)."""
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


def _later_losses(mean: Callable, rtol: float, what: str) -> Callable:
    """``every`` of :func:`_train_side_by_side`: each later step's loss (``mean``: over the ranks that
    split the batch) against the unsharded one, within ``rtol``."""
    return lambda loss, loss_ref: _check_loss(mean(loss), loss_ref, rtol, what=f"{what}, a later step")


def _train_side_by_side(ref: nn.Module, model: nn.Module, step: Callable, ref_step: Callable, steps: int,
                        first: Callable, every: Callable | None = None, **adamw) -> tuple:  # fmt: skip
    """``max(steps, 1)`` rounds on both models: gradients zeroed, ``step()`` and ``ref_step()`` (each
    runs a forward and its backward and returns the loss), ``first(loss, loss_ref)`` in the first
    round (the gradients of the initial weights), ``every(loss, loss_ref)`` in each later one (the
    loss of every step), then an AdamW step on both (none when ``steps`` is 0). Returns the two
    optimizers and the reference's weights before the first step (:func:`snapshot`)."""
    before = snapshot(ref)
    opt_ref, opt = torch.optim.AdamW(ref.parameters(), **adamw), torch.optim.AdamW(model.parameters(), **adamw)
    for round_ in range(max(steps, 1)):
        opt_ref.zero_grad()
        opt.zero_grad()
        loss, loss_ref = step(), ref_step()
        if round_ == 0:
            first(loss, loss_ref)
        elif every is not None:
            every(loss, loss_ref)
        if steps == 0:
            break
        opt_ref.step()
        opt.step()
    return opt_ref, opt, before


def _backward_loss(model: nn.Module, inputs: Mapping[str, Any], loss_fn: Callable | None) -> torch.Tensor:
    """One forward of ``model(**inputs)`` and the backward of its loss; returns the loss."""
    loss = _loss(model(**inputs), loss_fn)
    loss.backward()
    return loss


def _build_pair(build, config, policy, seed: int, reference_config) -> tuple[nn.Module, nn.Module]:
    """The unsharded reference and the sharded model, each built after ``torch.manual_seed(seed)``."""
    import shardcore

    torch.manual_seed(seed)
    ref = without_constant_parameters(build(), seed)
    if reference_config is not None:
        if reference_config.tensor_parallel_size != 1:
            raise ValueError("reference_config must keep the reference unsharded: tensor_parallel_size=1")
        ref = shardcore.optimize(ref, reference_config, policy=policy)
    torch.manual_seed(seed)
    return ref, shardcore.optimize(without_constant_parameters(build(), seed), config, policy=policy)
