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
import pathlib
import sys
from collections.abc import Iterator

import attrs
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from ..distributed import watch

__all__ = ["Sync", "as_watchdog_backend", "record_syncs"]

#: tensor methods and torch functions that read a device tensor's value on the host
READS = frozenset(
    {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "equal", "allclose", "cpu", "numpy"}
)
#: torch.distributed calls that block the host whatever the backend (barrier, pickled objects)
BLOCKING_CALLS = (
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)
_TORCH = pathlib.Path(torch.__file__).resolve().parent
_HERE = pathlib.Path(__file__).resolve()


@attrs.frozen
class Sync:
    """One host sync: what (``item``, ``wait(timeout)``, ``barrier``...) and where (``file:line (function)``)."""

    kind: str
    site: str

    @property
    def file(self) -> str:
        return self.site.split(":", 1)[0]


def _caller(packages: tuple[str, ...]) -> str | None:
    """``package/…/file.py:line (function)`` of the nearest frame outside torch and this module,
    if it belongs to one of ``packages``; else ``None``."""
    frame = sys._getframe(1)
    while frame is not None:
        path = pathlib.Path(frame.f_code.co_filename)
        if path.is_relative_to(_TORCH) or path == _HERE or "contextlib" in path.name:
            frame = frame.f_back
            continue
        for part in reversed(path.parts[:-1]):
            if part in packages or any(part.startswith(p) for p in packages if p.endswith("_")):
                rel = path.parts[path.parts.index(part) :]
                return f"{'/'.join(rel)}:{frame.f_lineno} ({frame.f_code.co_name})"
        return None
    return None


class _Reads(TorchFunctionMode):
    def __init__(self, found: list[Sync], packages: tuple[str, ...]) -> None:
        super().__init__()
        self.found, self.packages = found, packages

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        is_read = name in READS or (name == "to" and _to_host(args, kwargs or {}))
        if is_read:
            site = _caller(self.packages)
            if site is not None:
                self.found.append(Sync(name, site))
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
    docstring): device-to-host reads, ``Work.wait`` with a timeout, barriers and object collectives."""
    found: list[Sync] = []
    work_cls = dist.distributed_c10d.Work
    real_wait = work_cls.wait

    def wait(work, *args, **kwargs):
        if args or kwargs.get("timeout") is not None:  # NCCL blocks the host thread until it is done
            site = _caller(packages)
            if site is not None:
                found.append(Sync("wait(timeout)", site))
        return real_wait(work, *args, **kwargs)

    def blocking(name, real):
        def call(*args, **kwargs):
            site = _caller(packages)
            if site is not None:
                found.append(Sync(name, site))
            return real(*args, **kwargs)

        return call

    saved = {name: getattr(dist, name) for name in BLOCKING_CALLS}
    work_cls.wait = wait
    for name, real in saved.items():
        setattr(dist, name, blocking(name, real))
    try:
        with _Reads(found, packages):
            yield found
    finally:
        work_cls.wait = real_wait
        for name, real in saved.items():
            setattr(dist, name, real)
