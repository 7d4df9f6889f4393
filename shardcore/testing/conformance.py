"""The conformance check: a sharded model against the unsharded one, outputs, loss, every gradient.

Plugins (and third parties) test their policies with two pieces::

    from shardcore.testing import run_on_ranks, assert_sharded_matches

    def _check(tp):                        # runs on every rank
        assert_sharded_matches(build_model, make_batch(), ShardConfig(tensor_parallel_size=tp))

    def test_my_model():
        run_on_ranks(2, _check, 2)

:func:`run_on_ranks` (the rank launcher, :mod:`shardcore.distributed.launcher`) keeps one pool
of ``world_size`` worker processes per size alive for the whole test session.

Tolerances of :func:`assert_sharded_matches` (fp32, dropout 0): each scales with what is compared
(outputs with their own size, losses and gradients relative, parameters after ``steps`` AdamW
steps with the update's own size); the numbers and why are in :mod:`.tolerance`, the one place
that defines them. AdamW runs with ``eps=1e-5`` (not 1e-8): where a gradient is itself at the fp32
noise floor (a zero in exact arithmetic, such as attention's key bias, or a near-cancelling
embedding row), Adam's ``m / (sqrt(v) + eps)`` turns the noise into a step of up to ``lr``; with
``eps`` well above the noise an element's step differs by at most ``lr * noise / eps``, while a
real sharding error (a missed update, a doubled tied weight) still moves parameters by a large part
of the update. (Checked: the same comparison in float64 agrees to 1e-19.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .compare import (
    _build_pair,
    _check_every_grad,
    _check_loss,
    _check_outputs,
    _grad_check,
    _loss,
    snapshot,
)
from .steps import _check_params_after
from .structure import check_blocks, check_sharded_structure
from .tolerance import EAGER, GRAD, GRAD_FLOOR, LOSS, OUTPUT, STEP

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
    rtol_out: float = OUTPUT.rtol,
    rtol_loss: float = LOSS.rtol,
    grad_rtol: float = GRAD.rtol,
    grad_floor: float = GRAD_FLOOR,
    zero_grads: tuple[str, ...] = (),
    rtol_step: float = STEP.rtol,
    skip_outputs: tuple[str, ...] = ("loss", "past_key_values", "cache"),
    sharded_output_fn: Callable[[nn.Module, Any], Any] | None = None,
    max_param_fraction: float | None = None,
    reference_config=None,
) -> dict[str, Any]:
    """Check a sharded model against the unsharded one; run on every rank of the group.

    ``build()`` is called twice after ``torch.manual_seed(seed)``; one copy is sharded with
    :func:`shardcore.optimize` (and the other, given ``reference_config`` with TP=1, optimized with
    it: the way to give it the same kernels). Checked, with the tolerances of the module docstring:
    the structure (:func:`check_blocks`; for TP > 1 :func:`check_sharded_structure`: parallel
    modules in every block, fewer bytes per rank, at most ``max_param_fraction``, each local
    tensor exactly its ``ShardSpec`` slice); every floating-point output at any depth but the
    top-level ``skip_outputs`` (each rank's KV cache holds its own heads: generation checks it),
    after ``sharded_output_fn(model, output)`` if given; the loss (``output.loss`` or
    ``loss_fn(output)``); every gradient, gathered and as this rank's slice, by relative norm
    (below ``grad_floor`` x the largest it fails as untestable unless its name matches a
    ``zero_grads`` pattern); every parameter after ``steps`` AdamW steps, gathered and local.
    Returns the largest differences seen.
    """
    ref, model = _build_pair(build, config, policy, seed, reference_config)
    report = _structure(model, ref, policy, max_param_fraction)
    out_ref, out = ref(**inputs), model(**inputs)
    shown = out if sharded_output_fn is None else sharded_output_fn(model, out)
    report["max_abs_diff_outputs"] = _check_outputs(out_ref, shown, skip_outputs, rtol_out)
    loss_ref, loss = _loss(out_ref, loss_fn), _loss(out, loss_fn)
    report.update(_check_loss(loss, loss_ref, rtol_loss))
    loss_ref.backward()
    loss.backward()
    ref_params = dict(ref.named_parameters())
    check = _grad_check({n: p.grad for n, p in ref_params.items()}, grad_rtol, grad_floor, zero_grads)
    report["max_rel_err_grads"] = _check_every_grad(model, ref_params, check, "gathered")
    if steps:
        before = snapshot(ref)
        _train_both(ref, model, lambda m: _loss(m(**inputs), loss_fn), steps, lr, adam_eps)
        report["max_abs_diff_after_steps"] = _check_params_after(
            model, ref_params, steps, rtol_step, before, zero_grads
        )
    return report


def _structure(model: nn.Module, ref: nn.Module, policy, max_param_fraction) -> dict[str, Any]:
    """The policy's blocks, the kernels that run, and (TP > 1) the sharded structure."""
    import shardcore

    info = getattr(model, "shardcore", None)
    used = info.policy if info is not None else shardcore.resolve_policy(model, policy)
    blocks = check_blocks(used, model)
    report: dict[str, Any] = {"blocks": len(blocks)}
    if info is not None:
        report["kernels"] = dict(info.kernels)  # what each optimization switch runs
        if info.tp_size > 1:  # (TP=1 with Ulysses: the model is whole on every rank)
            report.update(check_sharded_structure(model, ref, blocks, max_param_fraction))
    return report


def _train_both(ref: nn.Module, model: nn.Module, loss_of: Callable, steps: int, lr: float, eps: float) -> None:
    """``steps`` AdamW steps on both models, the first on the gradients they hold now."""
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=lr, eps=eps)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=eps)
    for step in range(steps):
        if step:
            for m, o in ((ref, opt_ref), (model, opt)):
                o.zero_grad()
                loss_of(m).backward()
        opt_ref.step()
        opt.step()


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
    from ..integrations.hf.attention import hf_attention_switchable

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
    model must equal it as tightly as without them. The attention switch (``"flash"``) is also
    compared with the unsharded model on *eager* attention (the kernel against the plain math, not
    against itself), the other switches with the model's own modules, within fp32 kernel tolerances
    (:data:`EAGER_TOLERANCES`). Returns what each
    switch runs (``model.shardcore.kernels``)."""
    from ..config import ShardConfig

    config = ShardConfig(tensor_parallel_size=tp, **SWITCHES[switch])
    report = assert_sharded_matches(
        build, inputs, config, reference_config=ShardConfig(tensor_parallel_size=1, **SWITCHES[switch]), **kwargs
    )
    if switch == "flash":
        # a query row whose keys are all masked (left padding) has no defined attention: eager and SDPA
        # fill it differently, unsharded too (0.003 of shard-llama's loss, through the padded position
        # that predicts the first real token); against eager the first row is padded on the right
        # instead (every query sees a key; the masked kernels still run)
        mask = inputs.get("attention_mask")
        if mask is not None:
            mask = torch.ones_like(mask)
            mask[0, -min(2, mask.shape[-1] - 1) :] = 0
        right = dict(inputs) | ({"attention_mask": mask} if mask is not None else {})
        assert_sharded_matches(lambda: _on_eager_attention(build()), right, config, **(kwargs | EAGER_TOLERANCES))
    else:  # the fused norms and compiled modules against the model's own modules
        assert_sharded_matches(build, inputs, config, **(kwargs | EAGER_TOLERANCES))
    return report["kernels"]


#: the attention kernel against eager attention, fp32: rounding apart, not the sharded-vs-unsharded
#: bounds (:data:`.tolerance.EAGER` times each)
EAGER_TOLERANCES = {
    "rtol_out": OUTPUT.rtol * EAGER,
    "rtol_loss": LOSS.rtol * EAGER,
    "grad_rtol": GRAD.rtol * EAGER,
    "rtol_step": STEP.rtol * EAGER,
}


def _on_eager_attention(model: nn.Module) -> nn.Module:
    """``model`` with its attention computed by the plain math: HuggingFace's ``"eager"``
    implementation, timm's unfused path (``fused_attn = False``)."""
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter("eager")
    for module in model.modules():
        config = getattr(module, "config", None)
        if setter is None and config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = "eager"
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    return model
