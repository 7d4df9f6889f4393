"""How a collective is waited for: bounded on the host on gloo, never blocking the host on a GPU backend.

On **gloo** (CPU) shardcore waits with ``work.wait(timeout=bound)``: the host thread blocks, which
costs nothing there (the host does the work), and a collective the other ranks never join raises
:class:`~shardcore.distributed.scope.CollectiveTimeout` naming its module at the bound.

On **NCCL** (and the other device backends with their own watchdog, :data:`WATCHDOG_BACKENDS`)
a ``wait`` with a timeout blocks the host thread until the collective completes (PyTorch's
``WorkNCCL::wait``), so every tensor-parallel all-reduce would become a host sync and the host
could no longer queue kernels ahead of the GPU. There shardcore calls ``work.wait()`` without a
timeout (the current stream waits for the collective's; the host goes on) and records each
collective in a :class:`Watch`: its kind, sequence number, module and group, the time it was
entered and a CUDA event marking its end. A daemon thread polls the oldest unfinished record;
once one is older than the bound it reports the named cause (the same text as the gloo error) on
stderr and in :data:`REPORTS`. The process group's own watchdog then ends the process at the
group's timeout (twice the bound for the groups shardcore creates: ``groups.group_timeout``), so the hang is still bounded and
its cause named first. PyTorch's flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``), which the
groups shardcore starts on a GPU turn on (:func:`shardcore.distributed.use_flight_recorder`), adds
every rank's collective history, dumped at the group's timeout.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import pathlib
import sys
import threading
import time

import attrs
import torch
import torch.distributed as dist

from .ranks import PaperGroup

__all__ = [
    "FLIGHT_RECORDER",
    "REPORTS",
    "WATCH",
    "WATCHDOG_BACKENDS",
    "Watch",
    "backend_of",
    "backends",
    "blocks_host",
    "group_device",
    "use_flight_recorder",
    "watched",
]

#: backends whose process groups have their own watchdog, where shardcore never blocks the host
WATCHDOG_BACKENDS = frozenset({"nccl", "xccl", "hccl"})
#: the named causes the watch reported in this process (newest last)
REPORTS: list[str] = []
_LOG = logging.getLogger("shardcore")


def backends(group=None) -> dict[str, str]:
    """``{device type: backend}`` of ``group`` (default: the world's): ``{"cpu": "gloo", "cuda": "nccl"}``
    for ``"cpu:gloo,cuda:nccl"``, ``{"": "nccl"}`` for a group of one backend for every device."""
    name = str(dist.get_backend_config(group))
    return dict(part.split(":", 1) for part in name.split(",")) if ":" in name else {"": name}


def backend_of(group, device: torch.device) -> str:
    """The backend that runs a collective of ``group`` on a tensor on ``device`` (``"gloo"``, ``"nccl"``...);
    a group with a backend per device (``"cpu:gloo,cuda:nccl"``, also what a group created without
    naming a backend has) answers for ``device``'s type."""
    per_device = backends(group)
    return per_device.get(device.type, next(iter(per_device.values())))


def group_device(group) -> torch.device:
    """Where a tensor of shardcore's own (a digest, a flag, a receive buffer) must live for a collective
    of ``group``: the CPU when the group has a CPU backend (gloo, ``"cpu:gloo,cuda:nccl"``, or no
    process group at all), else the current CUDA device (an NCCL-only group takes no CPU tensor)."""
    if not dist.is_initialized() or isinstance(group, PaperGroup):
        return torch.device("cpu")  # a single process, or a paper group (explain)
    per_device = backends(group)
    if "cpu" in per_device or "nccl" not in per_device.values() or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def blocks_host(group, device: torch.device) -> bool:
    """Whether shardcore bounds a collective with a host-blocking ``wait(timeout)`` (gloo and any
    backend without a watchdog) rather than a stream wait plus the :class:`Watch`."""
    return backend_of(group, device) not in WATCHDOG_BACKENDS


def watched(device: torch.device) -> bool:
    """Whether a collective on ``device`` is recorded: not while this thread captures a CUDA graph
    (an event recorded in a capture never completes; the graph replays without shardcore)."""
    return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


#: a marker for a record whose wait raised: nothing to wait for any more
_DONE = object()


@attrs.define(eq=False)
class _Entry:
    started: float
    bound: float
    device: torch.device
    marker: object  # a CUDA event recorded after the collective, the work itself, _DONE; None: not yet
    cause: object  # callable(what) -> the named cause


def _done(marker) -> bool:
    if marker is None:  # entered, its end not marked yet
        return False
    if marker is _DONE:
        return True
    return bool(marker.query()) if isinstance(marker, torch.cuda.Event) else bool(marker.is_completed())


def _thread_local_capture_mode() -> None:
    """Let this (the watch's) thread query events while another thread captures a CUDA graph in
    the global capture mode, as PyTorch's NCCL watchdog does (``cudaThreadExchangeStreamCaptureMode``
    to thread-local); best effort: where the runtime is not found the default mode stays."""
    import ctypes

    maps = pathlib.Path("/proc/self/maps")
    paths = (
        {line.split()[-1] for line in maps.read_text().splitlines() if "libcudart" in line} if maps.exists() else set()
    )
    for path in sorted(paths) or ["libcudart.so"]:
        try:
            mode = ctypes.c_int(1)  # cudaStreamCaptureModeThreadLocal
            ctypes.CDLL(path).cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode))
            return
        except (OSError, AttributeError):
            continue
    _LOG.debug("shardcore watch: the CUDA runtime was not found; the thread's capture mode is the default")


class Watch:
    """The collectives entered on a watchdog backend and not yet seen finished, oldest first; a
    daemon thread reports the oldest once it outlives its bound (see the module docstring)."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self._pending: collections.deque[_Entry] = collections.deque()
        self._thread: threading.Thread | None = None
        self._reported: _Entry | None = None
        self._cuda_ready = False
        self._stop = threading.Event()
        self._at_exit = False

    def enter(self, work, device: torch.device, bound: float, cause) -> _Entry:
        """Record a collective about to be waited for; on CUDA :meth:`on_stream` then marks its end,
        and :meth:`failed` drops a record whose wait raised."""
        entry = _Entry(time.monotonic(), bound, device, None if device.type == "cuda" else work, cause)
        self._pending.append(entry)
        if (self._thread is None or not self._thread.is_alive()) and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="shardcore-watch", daemon=True)
            self._thread.start()
            if not self._at_exit:  # joined before the interpreter finalizes (no thread inside torch then)
                atexit.register(self.stop)
                self._at_exit = True
        return entry

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread and join it (at exit: it must not be inside a CUDA call while Python finalizes)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout_s)

    @staticmethod
    def on_stream(entry: _Entry) -> None:
        """After ``work.wait()`` made the device's current stream wait: an event there marks the
        end (holding the work instead would keep its tensors alive until the next poll)."""
        if entry.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(entry.device))
            entry.marker = event

    @staticmethod
    def failed(entry: _Entry) -> None:
        entry.marker = _DONE  # the error itself names the collective; nothing left to watch

    def check(self) -> str | None:
        """Drop the finished records; report the oldest unfinished one once past its bound."""
        pending = self._pending
        while pending and self._finished(pending[0]):
            pending.popleft()
        if not pending:
            return None
        oldest = pending[0]
        waited = time.monotonic() - oldest.started
        if waited <= oldest.bound or oldest is self._reported:
            return None
        self._reported = oldest
        message = oldest.cause(
            f"has not finished after {waited:.0f} s (the bound is {oldest.bound:g} s), still waiting for the other ranks"
        )
        REPORTS.append(message)
        _LOG.error(message)
        print(message, file=sys.stderr, flush=True)
        return message

    def _finished(self, entry: _Entry) -> bool:
        if isinstance(entry.marker, torch.cuda.Event) and not self._cuda_ready:
            torch.cuda.set_device(entry.device)  # a new thread starts on device 0: use the rank's own
            _thread_local_capture_mode()
            self._cuda_ready = True
        return _done(entry.marker)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.check()
            except Exception as err:  # the watch must never take the process down
                _LOG.debug("shardcore watch: %s", err)


#: this process's watch
WATCH = Watch()


#: PyTorch's NCCL flight recorder, on unless the user set otherwise: each rank keeps its last
#: collectives (kind, sizes, group, state, stack) and dumps them when its watchdog times out, so a
#: hang names what every rank was doing (``python -m torch.distributed.flight_recorder.fr_trace``)
FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def use_flight_recorder() -> dict[str, str]:
    """Turn PyTorch's NCCL flight recorder on for the NCCL groups created from now on (it is read when
    a group is made), keeping any of its variables the user set; the variables as they now are."""
    for name, value in FLIGHT_RECORDER.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in FLIGHT_RECORDER}
