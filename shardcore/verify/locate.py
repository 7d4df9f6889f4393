"""Where in a block the sharded run goes wrong: the module that raised, or the first whose output differs.

A block that raises or differs after sharding is refused by the block check; what a user needs next
is *which module* of it. :class:`Trace` hooks every module under a block for one run: the modules
running form a stack (the innermost one that raised is left on top), and each module's output is
kept in the order the modules finish. :func:`first_difference` compares two traces (unsharded,
sharded): the first module, not a parallel layer, whose output differs is where the plan's split
meets a computation it changes (a norm or a statistic over the split width, say).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Trace", "first_difference", "rel", "tolerance", "where_raised"]

_RTOL = {torch.float32: 1e-4, torch.float64: 1e-8}  # of the largest entry; 2e-2 for half precision


def tolerance(t: torch.Tensor) -> float:
    """The block check's bound on :func:`rel` for ``t``'s dtype."""
    return _RTOL.get(t.dtype, 2e-2)


def rel(actual: torch.Tensor, expected: torch.Tensor, floor: float = 1e-6) -> float:
    """The largest difference over the largest expected entry (at least ``floor``: a gradient that is
    zero in exact arithmetic, a key bias's, is compared with the block's scale, not with its own noise)."""
    if not expected.numel():
        return 0.0
    scale = max(expected.detach().abs().max().item(), floor)
    return (actual.detach().float() - expected.detach().float()).abs().max().item() / scale


class Trace:
    """Hooks on every module under ``root`` for one run (a context manager); see the module docstring."""

    def __init__(self, root: nn.Module, prefix: str = "", keep: bool = False) -> None:
        self.root, self.prefix, self.keep = root, prefix, keep
        self.stack: list[tuple[str, nn.Module]] = []
        self.outputs: list[tuple[str, torch.Tensor]] = []
        self._handles: list = []

    def __enter__(self) -> Trace:
        for name, module in self.root.named_modules():
            path = f"{self.prefix}.{name}" if self.prefix and name else (name or self.prefix)

            def push(m, args, path=path):
                self.stack.append((path, m))

            def pop(m, args, output, path=path):
                if self.stack and self.stack[-1][1] is m:
                    self.stack.pop()
                if self.keep and isinstance(output, torch.Tensor) and output.is_floating_point():
                    self.outputs.append((path, output.detach().clone()))

            self._handles += [module.register_forward_pre_hook(push), module.register_forward_hook(pop)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def raised_in(self) -> tuple[str, nn.Module] | None:
        """The innermost module still running after an exception: the one that raised."""
        return self.stack[-1] if self.stack else None


def where_raised(trace: Trace, err: BaseException) -> str:
    """A sentence naming the module that raised ``err`` (a split width reaching a computation over it)."""
    found = trace.raised_in()
    what = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    if found is None:
        return f"raised, sharded: {what}"
    path, module = found
    said = f"{path} ({type(module).__name__}) raised, sharded: {what}"
    if not any(word in what for word in ("shape", "size", "dimension")):
        return said
    return (
        f"{said} — it receives an activation the plan split over the ranks and computes over its whole width "
        "(a norm or a statistic over the split dimension): keep the layers around it whole (null), or write a policy"
    )


def first_difference(
    expected: list[tuple[str, torch.Tensor]], got: list[tuple[str, torch.Tensor]], skip: set[str], rank: int, tp: int
) -> str | None:
    """The first module (in the order they finished), not under a path of ``skip`` (the parallel
    layers), whose sharded output differs from the unsharded one (a split output compared with this
    rank's part); ``None`` when none differs."""
    seen: dict[tuple[str, int], torch.Tensor] = {}
    counts: dict[str, int] = {}
    for path, out in expected:
        seen[(path, counts.get(path, 0))] = out
        counts[path] = counts.get(path, 0) + 1
    counts.clear()
    for path, out in got:
        ref = seen.get((path, counts.get(path, 0)))
        counts[path] = counts.get(path, 0) + 1
        if ref is None or any(path == s or path.startswith(f"{s}.") for s in skip):
            continue
        if (
            out.shape != ref.shape
            and out.dim()
            and out.shape[:-1] == ref.shape[:-1]
            and out.shape[-1] * tp == ref.shape[-1]
        ):
            ref = ref.chunk(tp, dim=-1)[rank]
        if out.shape != ref.shape:
            continue
        err = rel(out, ref)
        if err > tolerance(ref):  # the block check's own bound
            return f"{path} is the first module whose output differs ({err:.2g} of its largest entry)"
    return None
