"""torch's own gradient norm right on a sharded model, with no patch: its gradients carry a mark.

``torch.nn.utils.clip_grad_norm_(model.parameters(), c)`` and ``torch.nn.utils.get_total_norm``
would compute this rank's norm of its slices: wrong for a sharded model (docs/parameters.md). The
extension point PyTorch gives a tensor that must compute differently is ``__torch_function__``, so
every gradient of a sharded model's parameter is marked: its class becomes :class:`ShardGrad`
(:class:`ShardDTensorGrad` for FSDP's DTensor gradients), in place, by a post-accumulate-grad hook
on each parameter (FSDP2 runs those hooks on its sharded parameters after its reduce-scatter).
Nothing of torch is replaced: a tensor that is not a sharded model's gradient is what it was.

torch's norm takes its per-tensor path for a marked gradient (its foreach kernels take only the
plain classes; with ``foreach=True`` it calls ``torch._foreach_norm``), and the mark answers:

* ``torch.linalg.vector_norm(g, p)`` / ``torch._foreach_norm(gs, p)``: this rank's norm of ``g``,
  as a :class:`NormPart` that remembers ``g``;
* ``part.to(device)``, ``torch.stack(parts)``: a part remembering every gradient in it;
* ``torch.linalg.vector_norm(stacked, p)``: the unsharded model's norm of those gradients, by
  :func:`shardcore.grad_norm.grad_norm` (a collective over one model replica).

Any other operation runs as on the tensor the mark sits on, its result unmarked (optimizer state
made from a gradient stays a plain tensor, and saves as one); a part in any other operation is the
local value it holds. Refused by name: a sharded model's gradients stacked with other tensors'
norms. A gradient replaced by a new tensor after the backward (``p.grad = t``) has no mark until the
next backward: clip before replacing it, or call ``shardcore.clip_grad_norm_(model, c)``.
"""

from __future__ import annotations

import functools
import sys
import weakref

import torch
from torch import nn

from .attach import attached
from .grad_norm import grad_norm, like_grads, owner

__all__ = ["NormPart", "ShardDTensorGrad", "ShardGrad", "mark_gradients", "unmark"]  # noqa: F822 (module __getattr__)


def _dtensor() -> type | None:
    """DTensor once something (FSDP) imported it, else ``None``: no gradient is one before that, and
    ``import shardcore`` does not import it (torch.distributed.tensor costs about a second)."""
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def _is_dtensor(t) -> bool:
    dtensor = _dtensor()
    return dtensor is not None and isinstance(t, dtensor)


def _plain(func, args, kwargs):
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _order(args, kwargs) -> float:
    """The ``ord`` of a ``vector_norm(x, ord)`` / ``_foreach_norm(xs, ord)`` call (2 by default)."""
    return float(kwargs.get("ord", args[1] if len(args) > 1 else 2.0))


def _whole_norm(args, kwargs) -> float | None:
    """The order of ``torch.linalg.vector_norm(x, ord)``, one scalar over all of ``x``, else None."""
    if not args or len(args) > 2 or set(kwargs) - {"ord"}:  # x=, dim, keepdim, dtype, out: as torch has it
        return None
    return _order(args, kwargs)


def _unmarked(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` as the plain tensor (DTensor) it is, sharing its data."""
    if _is_dtensor(grad):
        return _dtensor().from_local(
            grad.to_local(), grad.device_mesh, grad.placements, run_check=False, shape=grad.shape, stride=grad.stride()
        )
    return _plain(torch.Tensor.as_subclass, (grad, torch.Tensor), {})


def _local_norm(grad: torch.Tensor, order: float) -> torch.Tensor:
    local = grad.to_local() if _is_dtensor(grad) else grad
    return _plain(torch.linalg.vector_norm, (local, order), {})


def _on_gradient(func, args, kwargs):
    if func is torch.linalg.vector_norm and args and _marked(args[0]):
        order = _whole_norm(args, kwargs)
        if order is not None:
            return NormPart.of(_local_norm(args[0], order), [args[0]], order)
    if func in (torch.Tensor.__deepcopy__, torch.Tensor.__reduce_ex__) and _marked(args[0]):
        return func(_unmarked(args[0]), *args[1:], **kwargs)  # a copy (a save) is no model's gradient: plain
    if func is torch._foreach_norm and kwargs.get("dtype") is None:  # foreach=True: a part per marked gradient
        order = _order(args, kwargs)
        values = _plain(func, args, kwargs)
        return [
            NormPart.of(v if type(v) is torch.Tensor else _local_norm(g, order), [g], order) if _marked(g) else v
            for g, v in zip(args[0], values, strict=True)
        ]
    return _plain(func, args, kwargs)


class ShardGrad(torch.Tensor):
    """A sharded model's gradient (a plain local tensor): torch's norm of it is the unsharded one."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _on_gradient(func, args, kwargs or {})


@functools.cache
def _dtensor_grad() -> type:
    """:class:`ShardDTensorGrad`, made at its first use (its base, DTensor, imported then)."""
    from torch.distributed.tensor import DTensor

    class ShardDTensorGrad(DTensor):
        """A sharded model's gradient under FSDP (a DTensor on the data-parallel mesh), marked."""

        __slots__ = ()

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return _on_gradient(func, args, kwargs or {})

    ShardDTensorGrad.__module__, ShardDTensorGrad.__qualname__ = __name__, "ShardDTensorGrad"
    return ShardDTensorGrad


def __getattr__(name: str):
    if name == "ShardDTensorGrad":  # made on first use: see _dtensor_grad
        return _dtensor_grad()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _marked(t) -> bool:
    return isinstance(t, ShardGrad) or (_is_dtensor(t) and isinstance(t, _dtensor_grad()))


class NormPart(torch.Tensor):
    """This rank's norms of marked gradients, on the way through torch's total norm."""

    _grads: list
    _order: float
    _others: int

    @staticmethod
    def of(value: torch.Tensor, grads: list, order: float, others: int = 0) -> NormPart:
        """``grads``: the gradients (held weakly: a norm kept for logging must not keep its gradient)."""
        part = _plain(torch.Tensor.as_subclass, (value, NormPart), {})
        part._grads = [g if isinstance(g, weakref.ref) else weakref.ref(g) for g in grads]
        part._order, part._others = order, others
        return part

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else None
        if func is torch.Tensor.to and isinstance(first, NormPart):
            return NormPart.of(_plain(func, args, kwargs), first._grads, first._order, first._others)
        if (
            func is torch.stack
            and set(kwargs) <= {"tensors", "dim"}
            and kwargs.get("dim", args[1] if len(args) > 1 else 0) == 0
        ):
            return _stacked(list(first if first is not None else kwargs["tensors"]))
        order = _whole_norm(args, kwargs) if func is torch.linalg.vector_norm and isinstance(first, NormPart) else None
        return _plain(func, args, kwargs) if order is None else _total(first, order, args, kwargs)


def _stacked(tensors: list) -> torch.Tensor:
    parts = [t for t in tensors if isinstance(t, NormPart)]
    value = _plain(torch.stack, (tensors,), {})
    if len({p._order for p in parts}) != 1:
        return value  # norms of different orders: no total to mean
    grads = [g for p in parts for g in p._grads]
    others = len(tensors) - len(parts) + sum(p._others for p in parts)
    return NormPart.of(value, grads, parts[0]._order, others)


def _total(part: NormPart, order: float, args, kwargs) -> torch.Tensor:
    grads = [ref() for ref in part._grads]
    if order != part._order or any(g is None for g in grads):  # a norm of norms of another order; gone gradients
        return _plain(torch.linalg.vector_norm, args, kwargs)
    model, params = owner(grads, others=part._others)
    if model is None and not part._others:  # not a live sharded model's gradients: torch's own norm of them
        norms = [_plain(torch.linalg.vector_norm, (g, order), {}) for g in grads]
        return _plain(torch.linalg.vector_norm, (_plain(torch.stack, (norms,), {}), order), {})
    if model is None:
        return _plain(torch.linalg.vector_norm, args, kwargs)
    return like_grads(grad_norm(model, params, order), grads)


def _mark(param: torch.Tensor) -> None:
    grad = param.grad
    if grad is None or _marked(grad):
        return
    if type(grad) is torch.Tensor:
        grad.__class__ = ShardGrad
    elif type(grad) is _dtensor():
        grad.__class__ = _dtensor_grad()


def _hooked(param: torch.Tensor) -> bool:
    return any(h is _mark for h in (getattr(param, "_post_accumulate_grad_hooks", None) or {}).values())


def mark_gradients(model: nn.Module) -> None:
    """Mark the gradient of every trainable parameter of ``model`` after each accumulation, from
    now on; parameters added later (an adapter) are found before the next forward."""
    handles = model.__dict__.setdefault("_shardcore_marks", [])

    def mark_new(module: nn.Module, args=()) -> None:
        for p in module.parameters():
            if p.requires_grad and not _hooked(p):
                handles.append(p.register_post_accumulate_grad_hook(_mark))
                _mark(p)

    mark_new(model)
    attached(model).before_forward(model, "grad_mark", mark_new, what="parameters added since marked for the norm")
    pipeline = getattr(getattr(model, "shardcore", None), "pipeline", None)
    if pipeline is not None:  # zero-bubble schedules set later stages' weight gradients with no autograd hook
        pipeline.after_step.append(_mark_all)


def _mark_all(model: nn.Module) -> None:
    for p in model.parameters():
        _mark(p)


def unmark(model: nn.Module) -> None:
    """Stop marking ``model``'s gradients (torch's own norm of them from the next backward): for a
    model whose parameters became DTensors on the tensor-parallel mesh (benchmarks/bench_param_repr.py)."""
    for handle in model.__dict__.pop("_shardcore_marks", []):
        handle.remove()
    if attached(model).has("before", "grad_mark"):
        attached(model).remove(model, "before", "grad_mark")
