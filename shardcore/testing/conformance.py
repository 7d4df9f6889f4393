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

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .compare import (
    _check_gathered_params,
    _check_grads,
    _check_local_grads,
    _check_local_params,
    _loss,
    _tensors,
)
from .structure import check_blocks, check_sharded_structure

__all__ = ["assert_sharded_matches", "hidden_state_loss"]


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


def assert_sharded_matches(  # noqa: PLR0915
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
    tensor must be exactly its :class:`~shardcore.tensor_parallel.ShardSpec` slice of the unsharded one. Both
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
