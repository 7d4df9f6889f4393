"""The conformance check: a sharded model against the unsharded one, outputs, loss, every gradient.

Plugins (and third parties) test their policies with two pieces::

    from shardcore.testing import run_on_ranks, assert_sharded_matches

    def _check(tp):                        # runs on every rank
        assert_sharded_matches(build_model, make_batch(), ShardConfig(tensor_parallel_size=tp))

    def test_my_model():
        run_on_ranks(2, _check, 2)

:func:`run_on_ranks` (the rank launcher, :mod:`shardcore.distributed.launcher`) keeps one pool
of ``world_size`` worker processes per size alive for the whole test session.

Tolerances of :func:`assert_sharded_matches` (fp32, dropout 0), and why:

* outputs: max abs difference <= ``atol_out`` (1e-5). Sharding changes only the order of
  floating point sums (a split matmul plus an all-reduce), a few ulps per layer.
* loss: relative difference <= ``rtol_loss`` (1e-6).
* gradients, gathered to full size: ``allclose(atol=1e-6, rtol=1e-4)``, for *every* parameter.
* parameters after ``steps`` AdamW steps: max abs difference <= ``atol_step`` (1e-5). AdamW
  runs with ``eps=1e-5`` (not 1e-8). Gradients in fp32 carry rounding noise of ~1e-8 absolute
  (a few 1e-5 of the largest gradient) in any two runs that sum in a different order, sharded
  or not; where a gradient is itself that small (a zero in exact arithmetic, such as
  attention's key bias, or a near-cancelling embedding row), Adam's ``m / (sqrt(v) + eps)``
  turns the noise into a step of up to ``lr``. With ``eps`` well above the noise floor an
  element's step differs by at most ``lr * noise / eps`` (~1e-6), while a real sharding error
  (a missed update, a doubled tied weight) still moves parameters by ~``lr`` = 1e-3.
  (Checked: the same comparison in float64 agrees to 1e-19.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["assert_sharded_matches", "check_blocks", "hidden_state_loss"]


def _tensors(output: Any) -> dict[str, torch.Tensor]:
    """The floating-point tensors of a model output (a tensor, tuple, dict or ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return {"output": output}
    items = output.items() if isinstance(output, Mapping) else enumerate(output)
    found = {}
    for key, value in items:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            found[str(key)] = value
        elif isinstance(value, tuple | list) and value and all(isinstance(v, torch.Tensor) for v in value):
            for i, v in enumerate(value):
                if v.is_floating_point():
                    found[f"{key}.{i}"] = v
    return found


def _loss(output: Any, loss_fn: Callable | None) -> torch.Tensor:
    if loss_fn is not None:
        return loss_fn(output)
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise ValueError("the model output has no 'loss'; pass loss_fn=")
    return loss


def hidden_state_loss(*fields: str) -> Callable[[Any], torch.Tensor]:
    """A loss for models without one: the sum of ``mean(x ** 2)`` over the output ``fields``
    present (e.g. ``"last_hidden_state", "pooler_output"``), so every parameter gets a gradient."""
    if not fields:
        raise ValueError("hidden_state_loss needs at least one output field name")

    def loss(output: Any) -> torch.Tensor:
        found = [getattr(output, f, None) if not isinstance(output, Mapping) else output.get(f) for f in fields]
        found = [t for t in found if t is not None]
        if not found:
            raise ValueError(f"the model output has none of {fields}")
        return sum(t.pow(2).mean() for t in found)

    return loss


def check_blocks(policy, model: nn.Module) -> list[str]:
    """Check ``policy.blocks()`` on ``model``: a non-empty list of ``(name, module)`` pairs, each
    name resolving to its module, none nested in another, in the model's own order. Returns the names."""
    blocks = policy.blocks()
    if not blocks:
        raise AssertionError(f"{type(policy).__name__}.blocks() returned no blocks")
    order = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    names = []
    for name, module in blocks:
        if model.get_submodule(name) is not module:
            raise AssertionError(f"{type(policy).__name__}.blocks(): {name!r} is not the module it names")
        names.append(name)
    if len(set(names)) != len(names):
        raise AssertionError(f"{type(policy).__name__}.blocks() names a block twice: {names}")
    nested = [(a, b) for a in names for b in names if a != b and b.startswith(a + ".")]
    if nested:
        raise AssertionError(f"{type(policy).__name__}.blocks(): {nested[0][1]!r} is inside {nested[0][0]!r}")
    if [order[id(m)] for _, m in blocks] != sorted(order[id(m)] for _, m in blocks):
        raise AssertionError(f"{type(policy).__name__}.blocks() are not in the model's order: {names}")
    return names


def assert_sharded_matches(
    build: Callable[[], nn.Module],
    inputs: Mapping[str, Any],
    config=None,
    *,
    policy=None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    seed: int = 0,
    steps: int = 3,
    lr: float = 1e-3,
    adam_eps: float = 1e-5,
    atol_out: float = 1e-5,
    rtol_loss: float = 1e-6,
    grad_atol: float = 1e-6,
    grad_rtol: float = 1e-4,
    atol_step: float = 1e-5,
    skip_outputs: tuple[str, ...] = ("loss",),
    sharded_output_fn: Callable[[nn.Module, Any], Any] | None = None,
) -> dict[str, float]:
    """Check a sharded model against the unsharded one; run on every rank of the group.

    ``build()`` is called twice after ``torch.manual_seed(seed)``; one copy is sharded with
    :func:`shardcore.optimize`. Both run ``model(**inputs)``: every floating-point output must
    match, the loss (``output.loss`` or ``loss_fn(output)``) too, then every gradient (gathered)
    and every parameter after ``steps`` AdamW steps; the policy's :meth:`~shardcore.Policy.blocks`
    are checked with :func:`check_blocks`. Returns the largest differences seen.

    ``sharded_output_fn(model, output)``, if given, maps the sharded output before it is
    compared (e.g. to gather logits kept vocab-parallel by ``parallel_output=True``).
    """
    import shardcore

    torch.manual_seed(seed)
    ref = build()
    torch.manual_seed(seed)
    model = shardcore.optimize(build(), config, policy=policy)
    info = getattr(model, "shardcore", None)
    used = info.policy if info is not None else shardcore.resolve_policy(model, policy)
    report = {"blocks": len(check_blocks(used, model))}

    out_ref, out = ref(**inputs), model(**inputs)
    ref_t = _tensors(out_ref)
    got_t = _tensors(out if sharded_output_fn is None else sharded_output_fn(model, out))
    if set(ref_t) != set(got_t):
        raise AssertionError(f"output fields differ: unsharded {sorted(ref_t)} vs sharded {sorted(got_t)}")
    worst = 0.0
    for key, expected in ref_t.items():
        if key in skip_outputs:
            continue
        actual = got_t[key]
        if actual.shape != expected.shape:
            raise AssertionError(f"output {key!r}: shape {tuple(actual.shape)} != unsharded {tuple(expected.shape)}")
        diff = (actual - expected).abs().max().item() if expected.numel() else 0.0
        if not diff <= atol_out:
            raise AssertionError(f"output {key!r}: max abs diff {diff:.3g} > {atol_out}")
        worst = max(worst, diff)
    report["max_abs_diff_outputs"] = worst

    loss_ref, loss = _loss(out_ref, loss_fn), _loss(out, loss_fn)
    rel = abs(loss.item() - loss_ref.item()) / max(abs(loss_ref.item()), 1e-12)
    if not rel <= rtol_loss:
        raise AssertionError(
            f"loss {loss.item():.9g} vs unsharded {loss_ref.item():.9g}: relative diff {rel:.3g} > {rtol_loss}"
        )
    report["loss"], report["loss_unsharded"], report["loss_rel_diff"] = loss.item(), loss_ref.item(), rel

    loss_ref.backward()
    loss.backward()
    ref_grads = dict(ref.named_parameters())
    worst = 0.0
    seen = set()
    for name, grad in shardcore.full_named_tensors(model, grads=True):
        seen.add(name)
        expected = ref_grads[name].grad
        if (grad is None) != (expected is None):
            raise AssertionError(
                f"gradient of {name}: sharded {'None' if grad is None else 'set'}, unsharded {'None' if expected is None else 'set'}"
            )
        if grad is None:
            continue
        if grad.shape != expected.shape:
            raise AssertionError(f"gradient of {name}: shape {tuple(grad.shape)} != unsharded {tuple(expected.shape)}")
        if not torch.allclose(grad, expected, atol=grad_atol, rtol=grad_rtol):
            diff = (grad - expected).abs().max().item()
            raise AssertionError(f"gradient of {name}: max abs diff {diff:.3g} (atol {grad_atol}, rtol {grad_rtol})")
        worst = max(worst, (grad - expected).abs().max().item())
    if seen != set(ref_grads):
        raise AssertionError(
            f"parameters differ: missing {sorted(set(ref_grads) - seen)}, extra {sorted(seen - set(ref_grads))}"
        )
    report["max_abs_diff_grads"] = worst

    if steps:
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=lr, eps=adam_eps)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=adam_eps)
        for step in range(steps):
            if step:
                for m, o in ((ref, opt_ref), (model, opt)):
                    o.zero_grad()
                    _loss(m(**inputs), loss_fn).backward()
            opt_ref.step()
            opt.step()
        ref_params = dict(ref.named_parameters())
        worst = 0.0
        for name, full in shardcore.full_named_tensors(model):
            diff = (full - ref_params[name].detach()).abs().max().item()
            if not diff <= atol_step:
                raise AssertionError(
                    f"parameter {name} after {steps} AdamW steps: max abs diff {diff:.3g} > {atol_step}"
                )
            worst = max(worst, diff)
        report["max_abs_diff_after_steps"] = worst
    return report
