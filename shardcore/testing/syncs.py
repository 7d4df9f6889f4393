"""The sync audit: what in shardcore's code would stop the host until the GPU caught up.

On a GPU, the host queues kernels ahead of the device; anything that waits for the device on the
host (a device-to-host read: ``.item()``, ``.tolist()``, ``bool(tensor)``, ``torch.equal``...; a
collective waited for with a timeout on NCCL; a barrier; an object collective) drains that queue.
This machine has no GPU, so the audit runs the CPU step with the backend *reported* as NCCL
(:func:`as_watchdog_backend`: shardcore's collectives take their GPU path) and records (with
:func:`record_syncs`) every such call whose nearest caller outside PyTorch is shardcore's code or
a plugin's (``shardcore``, ``shard_*``): the model library's own syncs are not counted, they are
the unsharded model's too. On CPU tensors a read is not a sync; the audit counts what the same
code does on a GPU.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import attrs
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..distributed import audit, watch

__all__ = ["Sync", "as_watchdog_backend", "device_strict", "record_syncs"]

#: tensor methods and torch functions that read a device tensor's value on the host
READS = frozenset(
    {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "equal", "allclose", "cpu", "numpy"}
    | {"nonzero", "masked_select", "unique"}  # the output's size depends on the values
)


@attrs.frozen
class Sync:
    """One host sync: what (``item``, ``wait(timeout)``, ``barrier``...) and where (``file:line (function)``)."""

    kind: str
    site: str

    @property
    def file(self) -> str:
        return self.site.split(":", 1)[0]


#: frames passed over to find the caller: this module, and the wrapper's doors that tell it of a sync
_SKIPPED = frozenset({__name__, "shardcore.distributed.audit", "shardcore.distributed.objects"})


def _caller(packages: tuple[str, ...]) -> str | None:
    """``module/file.py:line (function)`` of the nearest frame outside torch, this module and
    contextlib, if its module (by name: ``shardcore.…``, ``shard_llama.…``) is one of ``packages``
    (a name ending in ``_`` is a prefix); else ``None``."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        root = module.split(".")[0]
        if root in ("torch", "contextlib") or module in _SKIPPED:
            frame = frame.f_back
            continue
        if root in packages or any(root.startswith(p) for p in packages if p.endswith("_")):
            return f"{module.replace('.', '/')}.py:{frame.f_lineno} ({frame.f_code.co_name})"
        return None
    return None


#: the aten ops behind a device-to-host read (``item``, ``bool``/``int``/``float`` of a tensor, ...)
ATEN_READS = frozenset(
    {"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "masked_select", "_unique2", "unique_dim"}
)


class _Reads(TorchFunctionMode):
    """The reads a forward makes, at the Python API (``tolist``, ``.cpu()`` included). A backward
    started inside (``loss.backward()``) runs while this mode is off (its handler pops it): the
    reads there are :class:`_AtenReads`', which stays on the stack through the autograd engine."""

    def __init__(self, found: list[Sync], packages: tuple[str, ...]) -> None:
        super().__init__()
        self.found, self.packages = found, packages
        self.backward_depth = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS or (name == "to" and _to_host(args, kwargs)):
            site = _caller(self.packages)
            if site is not None:
                self.found.append(Sync(name, site))
        if name not in ("backward", "grad"):
            return func(*args, **kwargs)
        self.backward_depth += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.backward_depth -= 1


class _AtenReads(TorchDispatchMode):
    """The reads of the backward (autograd Functions' backward, gradient hooks), by their aten op."""

    def __init__(self, reads: _Reads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.reads.backward_depth and func.__name__.split(".")[0] in ATEN_READS:
            site = _caller(self.reads.packages)
            if site is not None:
                self.reads.found.append(Sync(func.__name__.split(".")[0], site))
        return func(*args, **(kwargs or {}))


def _to_host(args, kwargs) -> bool:
    """``tensor.to(cpu)`` of a tensor not on the CPU (a move to where it already is costs nothing,
    here or on a GPU: ``.to(param.device)``; an explicit ``.cpu()`` always counts)."""
    if not args or not isinstance(args[0], torch.Tensor) or args[0].device.type == "cpu":
        return False
    targets = [*args[1:], kwargs.get("device")]
    return any(str(t) == "cpu" or (isinstance(t, torch.device) and t.type == "cpu") for t in targets)


@contextlib.contextmanager
def as_watchdog_backend() -> Iterator[None]:
    """Inside: every process group answers ``"nccl"`` to shardcore's backend query, so its
    collectives wait as they do on a GPU (on the stream, no host block; the watch names a hang)."""
    saved = watch.backend_of
    watch.backend_of = lambda group, device: "nccl"
    try:
        yield
    finally:
        watch.backend_of = saved


@contextlib.contextmanager
def record_syncs(packages: tuple[str, ...] = ("shardcore", "shard_")) -> Iterator[list[Sync]]:
    """Record each host sync made by code of ``packages`` inside the ``with`` block (see the module
    docstring): device-to-host reads, the barriers and object collectives the wrapper tells
    :mod:`shardcore.distributed.audit` of, and ``Work.wait`` with a timeout. That last one is any
    code's call on a torch ``Work`` (a mutant's ``work.wait(timeout=...)`` too), so the audit wraps
    the ``Work`` class's method for the block alone and puts it back on the way out: the one
    instrument of torch's it holds, and never beyond the ``with``."""
    found: list[Sync] = []

    def told(kind: str) -> None:
        site = _caller(packages)
        if site is not None:
            found.append(Sync(kind, site))

    work_cls = dist.distributed_c10d.Work
    real_wait = work_cls.wait

    def wait(work, *args, **kwargs):
        if args or kwargs.get("timeout") is not None:  # NCCL blocks the host thread until it is done
            told("wait(timeout)")
        return real_wait(work, *args, **kwargs)

    audit.LISTENERS.append(told)
    work_cls.wait = wait
    try:
        reads = _Reads(found, packages)
        with _AtenReads(reads), reads:
            yield found
    finally:
        work_cls.wait = real_wait
        audit.LISTENERS.remove(told)


@contextlib.contextmanager
def device_strict(device: torch.device | str = "cpu") -> Iterator[None]:
    """The device-strict audit: inside, a tensor made without a device lands on ``meta`` (the default
    device), and every tensor handed to one of shardcore's collectives must be on ``device`` (the
    model's) or :class:`~shardcore.distributed.audit.DeviceAuditError` names the collective. On this
    CPU-only machine a buffer a GPU run would allocate on the CPU (``torch.empty(shape)``, then a
    receive or an all-gather on an NCCL group) is caught so: it is on ``meta``, not ``device``."""
    audit.STRICT.append(torch.device(device))
    try:
        with torch.device("meta"):  # the default device for the block alone (set_default_device would outlive it)
            yield
    finally:
        audit.STRICT.pop()
