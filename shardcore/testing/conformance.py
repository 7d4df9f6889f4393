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
* gradients, for *every* parameter, gathered to full size and as each rank's own slice:
  ``||g - g_ref|| <= grad_rtol * ||g_ref||`` (1e-4; sharding reorders sums, ~1e-6 relative). A
  relative norm, not ``allclose`` with an absolute floor: under an absolute floor a gradient of
  1e-8 could be zeroed or sign-flipped and pass. A gradient whose norm is below ``grad_floor``
  (1e-5) times the largest is fp32 noise and fails as untestable, unless declared zero in exact
  arithmetic with ``zero_grads``.
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

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .structure import check_blocks, check_sharded_structure, local_expected

__all__ = ["assert_sharded_matches", "hidden_state_loss"]


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


def hidden_state_loss(*fields: str, seed: int = 1234) -> Callable[[Any], torch.Tensor]:
    """A loss for models without one: ``mean((x - r) ** 2)`` summed over the output ``fields``
    present (e.g. ``"last_hidden_state", "pooler_output"``), ``r`` a fixed random tensor of ``x``'s shape.

    Not ``mean(x ** 2)``: after a final LayerNorm that is ~1 whatever the input, so most
    gradients would vanish into fp32 noise and a wrong one could not be seen; and not ``mean(x * r)``,
    which is ~0, so a relative loss comparison would measure noise.
    """
    if not fields:
        raise ValueError("hidden_state_loss needs at least one output field name")

    def loss(output: Any) -> torch.Tensor:
        found = [output.get(f) if isinstance(output, Mapping) else getattr(output, f, None) for f in fields]
        found = [t for t in found if t is not None]
        if not found:
            raise ValueError(f"the model output has none of {fields}")
        probes = [torch.randn(t.shape, generator=torch.Generator().manual_seed(seed + i)) for i, t in enumerate(found)]
        return sum((t - r.to(t)).pow(2).mean() for t, r in zip(found, probes, strict=True))

    return loss


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
    unless it is declared zero in exact arithmetic (``zero_grads``): then both must be that small."""
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
        if 0.0 < norm < floor * scale:
            raise AssertionError(
                f"gradient of {name} is too small to test: norm {norm:.3g} < {floor:g} x the largest gradient norm "
                f"({scale:.3g}), at the fp32 noise floor, where a missing or sign-flipped gradient would pass; give "
                "the test model inputs and weights that reach it (or, if it is zero in exact arithmetic, list it "
                "in zero_grads=)"
            )
        rel = _rel_err(grad, expected)
        if not rel <= rtol:
            raise AssertionError(f"gradient of {name} ({where}): relative error {rel:.3g} > {rtol} (norm {norm:.3g})")
        worst = max(worst, rel)
    return worst


def _step_tolerance(name: str, atol_step: float, zero_grads: tuple[str, ...]) -> float:
    # a gradient that is fp32 noise turns into AdamW steps of up to lr * noise / eps each,
    # different noise in the two runs: 10x the tolerance for parameters declared zero
    return atol_step * (10 if _declared_zero(name, zero_grads) else 1)


def _check_gathered_params(model: nn.Module, expected: Mapping, steps: int, atol_step: float, zero_grads=()) -> float:
    """Every parameter of ``model``, gathered (:func:`shardcore.full_named_tensors`), against
    ``expected[name]`` after ``steps`` optimizer steps; returns the largest difference."""
    import shardcore

    worst = 0.0
    for name, full in shardcore.full_named_tensors(model):
        tol = _step_tolerance(name, atol_step, zero_grads)
        diff = (full - expected[name].detach()).abs().max().item()
        if not diff <= tol:
            raise AssertionError(f"parameter {name} after {steps} AdamW steps: max abs diff {diff:.3g} > {tol:g}")
        worst = max(worst, diff)
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


def _check_local_params(
    model: nn.Module, ref_params: Mapping[str, torch.Tensor], steps: int, atol_step: float, zero_grads=()
) -> float:
    """Every parameter as this rank holds it against the same part of the unsharded one after ``steps``."""
    expected = local_expected(model, {n: p.detach() for n, p in ref_params.items()})
    worst = 0.0
    for name, param in model.named_parameters():
        tol = _step_tolerance(name, atol_step, zero_grads)
        mine, want = _local(param.detach()), _held_part(param, expected[name])
        if mine.shape != want.shape:
            raise AssertionError(
                f"parameter {name}: this rank holds shape {tuple(mine.shape)}, its part is {tuple(want.shape)}"
            )
        diff = (mine - want).abs().max().item() if mine.numel() else 0.0
        if not diff <= tol:
            raise AssertionError(
                f"parameter {name} after {steps} AdamW steps, this rank's slice: max abs diff {diff:.3g} > {tol:g}"
            )
        worst = max(worst, diff)
    return worst


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
    grad_rtol: float = 1e-4,
    grad_floor: float = 1e-5,
    zero_grads: tuple[str, ...] = (),
    atol_step: float = 1e-5,
    skip_outputs: tuple[str, ...] = ("loss", "past_key_values"),
    sharded_output_fn: Callable[[nn.Module, Any], Any] | None = None,
    max_param_fraction: float | None = None,
    reference_config=None,
) -> dict[str, Any]:
    """Check a sharded model against the unsharded one; run on every rank of the group.

    ``build()`` is called twice after ``torch.manual_seed(seed)``; one copy is sharded with
    :func:`shardcore.optimize`. If sharding happened (TP > 1), the model must hold parallel
    modules in every block of :meth:`~shardcore.Policy.blocks`, fewer parameter bytes per rank
    than unsharded (at most ``max_param_fraction`` of them, if given), and on every rank each local
    tensor must be exactly its :class:`~shardcore.layers.ShardSpec` slice of the unsharded one. Both
    models run ``model(**inputs)``: every floating-point output must match, at any depth, but the
    top-level fields in ``skip_outputs`` (by default the loss, compared relatively, and
    ``past_key_values``: each rank's KV cache holds its own heads; :func:`assert_generate_matches`
    checks the cache through the tokens it produces); the loss (``output.loss`` or
    ``loss_fn(output)``) too. Then every gradient, both gathered and as
    this rank's slice (replica copies and zero padding rows included), must match by relative
    norm, and every parameter after ``steps`` AdamW steps, gathered and local. The policy's
    :meth:`~shardcore.Policy.blocks` are checked with :func:`check_blocks`. Returns the largest
    differences seen.

    Gradients whose norm is below ``grad_floor`` times the largest one are at the fp32 noise
    floor and cannot be tested: the check fails, unless their names match a pattern of
    ``zero_grads`` (``fnmatch``), parameters whose gradient is zero in exact arithmetic (a key
    projection's bias: softmax ignores a constant shift), which must then stay that small.

    ``sharded_output_fn(model, output)``, if given, maps the sharded output before it is
    compared (e.g. to gather logits kept vocab-parallel by ``parallel_output=True``).

    ``reference_config`` (a :class:`~shardcore.ShardConfig` with ``tensor_parallel_size=1``), if
    given, is applied to the unsharded reference with :func:`shardcore.optimize`: the way to give
    it the same kernels (``enable_flash_attention``, ...) as the sharded model.
    """
    import shardcore

    torch.manual_seed(seed)
    ref = build()
    if reference_config is not None:
        if reference_config.tensor_parallel_size != 1:
            raise ValueError("reference_config must keep the reference unsharded: tensor_parallel_size=1")
        ref = shardcore.optimize(ref, reference_config, policy=policy)
    torch.manual_seed(seed)
    model = shardcore.optimize(build(), config, policy=policy)
    info = getattr(model, "shardcore", None)
    used = info.policy if info is not None else shardcore.resolve_policy(model, policy)
    blocks = check_blocks(used, model)
    report: dict[str, Any] = {"blocks": len(blocks)}
    if info is not None:
        report["kernels"] = dict(info.kernels)  # what each optimization switch runs
        if info.tp_size > 1:  # (TP=1 with Ulysses: the model is whole on every rank)
            report.update(check_sharded_structure(model, ref, blocks, max_param_fraction))

    out_ref, out = ref(**inputs), model(**inputs)
    ref_t = _tensors(out_ref, skip_outputs)
    got_t = _tensors(out if sharded_output_fn is None else sharded_output_fn(model, out), skip_outputs)
    if set(ref_t) != set(got_t):
        raise AssertionError(f"output fields differ: unsharded {sorted(ref_t)} vs sharded {sorted(got_t)}")
    worst = 0.0
    for key, expected in ref_t.items():
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
    ref_params = dict(ref.named_parameters())
    ref_grads = {n: p.grad for n, p in ref_params.items()}
    scale = max((g.double().norm().item() for g in ref_grads.values() if g is not None), default=0.0)
    gathered = dict(shardcore.full_named_tensors(model, grads=True))
    if set(gathered) != set(ref_params):
        raise AssertionError(
            f"parameters differ: missing {sorted(set(ref_params) - set(gathered))}, "
            f"extra {sorted(set(gathered) - set(ref_params))}"
        )
    check = {"scale": scale, "rtol": grad_rtol, "floor": grad_floor, "zero_grads": zero_grads}
    worst = _check_grads(((n, g, ref_grads[n]) for n, g in gathered.items()), where="gathered", **check)
    worst = max(worst, _check_local_grads(model, ref_grads, **check))
    report["max_rel_err_grads"] = worst

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
        worst = _check_gathered_params(model, ref_params, steps, atol_step, zero_grads)
        worst = max(worst, _check_local_params(model, ref_params, steps, atol_step, zero_grads))
        report["max_abs_diff_after_steps"] = worst
    return report


#: The ``ShardConfig`` fields of each optimization switch, by short name (plugins' tests parametrize on them).
SWITCHES: dict[str, dict[str, bool]] = {
    "flash": {"enable_flash_attention": True},
    "norm": {"enable_fused_normalization": True},
    "jit": {"enable_jit_fused": True},
    "all": {"enable_all_optimization": True},
}


def switch_refusal(build: Callable[[], nn.Module], switch: str, tp: int) -> str:
    """The error every rank gets when ``build()``'s model refuses a switch (see :func:`refusal_message`)."""
    from ..config import ShardConfig
    from .refusals import refusal_message

    return refusal_message(build, ShardConfig(tensor_parallel_size=tp, **SWITCHES[switch]))


def flash_refused_here(model_class: type, refused: Callable[[int], str], tp: int = 2) -> bool:
    """Where this transformers cannot switch ``model_class``'s attention at run time (4.x models
    whose attention class is fixed when built), check that ``enable_flash_attention`` is refused on
    every rank before any collective, naming the fix, and return ``True``; else ``False`` (test
    the switch). ``refused(tp)`` is the plugin's module-level rank function calling
    :func:`switch_refusal` on its model."""
    from ..distributed.launcher import run_on_ranks
    from ..kernels import hf_attention_switchable

    if hf_attention_switchable(model_class):
        return False
    for message in run_on_ranks(tp, refused, tp):
        assert "cannot switch its attention implementation" in message, message
        assert "attn_implementation='sdpa'" in message, message
    return True


def assert_switch_matches(
    build: Callable[[], nn.Module], inputs: Mapping[str, Any], switch: str, tp: int, **kwargs: Any
) -> dict[str, str]:
    """:func:`assert_sharded_matches` for one optimization switch (a key of :data:`SWITCHES`) at
    ``tp``: the unsharded reference runs the same kernels (``reference_config``), so the sharded
    model must equal it as tightly as without them. Returns what each switch runs
    (``model.shardcore.kernels``)."""
    from ..config import ShardConfig

    report = assert_sharded_matches(
        build,
        inputs,
        ShardConfig(tensor_parallel_size=tp, **SWITCHES[switch]),
        reference_config=ShardConfig(tensor_parallel_size=1, **SWITCHES[switch]),
        **kwargs,
    )
    return report["kernels"]
