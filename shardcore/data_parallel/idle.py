"""Modules that run only when an input is given, under data parallelism: every rank runs them.

A Llava's vision tower runs only for a batch with images. Give one data-parallel rank a text-only
part and the others images, and that rank skips the tower: under FSDP it never gathers nor reduces
the tower's units while the others do (a collective mismatch: a crash on gloo, a hang on NCCL);
under DDP its reducer waits for gradients that never come. The policy declares such modules
(:class:`~shardcore.spec.DataParallelSpec` ``idle_runs``: the input, a stand-in run of them, and
``at``, the module the model's forward calls next); :func:`install_idle_runs` notes, before each
training forward, which declared inputs the call lacks, runs the stand-in just before ``at``'s
forward (where the real input's modules would have run, so every rank issues the same collectives
in the same order) and adds zero times its result to ``at``'s output. The rank's gradient there is
then exactly zero: the unsharded model's for the part without images. Its backward also comes in the
real run's order: the stand-in's nodes are older than ``at``'s, as the real tower's are.

Under pipeline parallelism the first stage holds such modules (it takes the input) and calls the model
part that reads the input (Llava's ``LlavaModel``), not the whole model: the inputs are then noted at
each module above ``at`` whose forward takes the input by name, and only while the rank's first stage
runs (a later stage of the same rank, an interleaved schedule's, calls that part without the input too).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..attach import attached

__all__ = ["install_idle_runs", "stage_takers"]


def _missing(model: nn.Module, names: list[str], args: tuple, kwargs: dict) -> list[str]:
    """The declared inputs this call does not give (absent or ``None``), positional ones included."""
    try:
        given = inspect.signature(type(model).forward).bind_partial(model, *args, **kwargs).arguments
    except TypeError:  # a call the forward refuses: its own error comes next
        given = {}
    return [n for n in names if given.get(n) is None and kwargs.get(n) is None]


def _with_zero(output: Any, zero: torch.Tensor) -> Any:
    """``output`` with ``zero`` added to its first floating-point tensor (a tensor, a ModelOutput's
    first field, a tuple's first element): what the rest of the forward reads on."""
    if isinstance(output, torch.Tensor) and output.is_floating_point():
        return output + zero.to(output.dtype)
    if isinstance(output, Mapping):
        for key, value in output.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                output[key] = value + zero.to(value.dtype)
                return output
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return (_with_zero(output[0], zero), *output[1:])
    raise TypeError(
        f"{type(output).__name__}: the module the idle run goes before returns no floating-point tensor "
        "to carry zero times its result; declare IdleRun(at=...) at a module returning hidden states"
    )


def stage_takers(model: nn.Module, runs: Mapping[str, Any]) -> list[nn.Module]:
    """The modules above each run's ``at`` (``model`` excluded) whose forward takes that run's input by name:
    where a pipeline's first stage hands the input on. Refused by name where a run has none (its idle run
    could not tell a batch without the input; the mismatch it exists for would come back): every rank holds
    the model's structure, so every rank refuses alike, before any stage runs."""
    out = []
    for name, idle in runs.items():
        parts = idle.at.split(".")
        found = [model.get_submodule(".".join(parts[:depth])) for depth in range(1, len(parts))]
        found = [m for m in found if name in inspect.signature(type(m).forward).parameters]
        if not found:
            raise NotImplementedError(
                f"{type(model).__name__}: pipeline stages with data parallelism and the idle run of {name!r} "
                f"(IdleRun(at={idle.at!r})): no module above {idle.at!r} takes {name!r} by name, so a first stage "
                f"cannot tell a batch without it; give every data-parallel rank {name!r}, or no pipeline"
            )
        out += [m for m in found if m not in out]
    return out


def install_idle_runs(model: nn.Module, runs: Mapping[str, Any], first_stage: nn.Module | None = None) -> None:
    """Hook ``model`` so that a training forward lacking an input of ``runs`` (``{name: IdleRun}``)
    runs that input's modules on their stand-in before the forward of ``at`` (see the module);
    ``first_stage``: under pipeline parallelism, this rank's first stage (the inputs noted while it runs)."""
    if not runs:
        return
    lacking: list[str] = []
    pending: list[torch.Tensor] = []
    running = [first_stage is None]  # whether the stage that takes the inputs runs

    def note(module: nn.Module, args: tuple, kwargs: dict) -> None:
        wanted = running[0] and torch.is_grad_enabled() and module.training
        lacking[:] = _missing(module, list(runs), args, kwargs) if wanted else []
        pending.clear()

    def run(name: str):
        def before(module: nn.Module, args: tuple) -> None:
            if name in lacking:
                lacking.remove(name)
                pending.append(runs[name].run(model))

        return before

    def carry(module: nn.Module, args: tuple, output: Any) -> Any:
        if not pending:
            return output
        zero = sum(t.float().sum() for t in pending) * 0.0
        pending.clear()
        return _with_zero(output, zero)

    what = f"a batch without {sorted(runs)}: their modules run idle"
    if first_stage is None:
        attached(model).before_forward(model, "idle_runs", note, with_kwargs=True, what=what)
    else:
        first_stage.register_forward_pre_hook(lambda *_: running.__setitem__(0, True))
        first_stage.register_forward_hook(lambda *_: running.__setitem__(0, False), always_call=True)
        for module in stage_takers(model, runs):
            attached(module).before_forward(module, "idle_runs", note, with_kwargs=True, what=what)
    for name, idle in runs.items():
        at = model.get_submodule(idle.at)
        at.register_forward_pre_hook(run(name))
        at.register_forward_hook(carry)
