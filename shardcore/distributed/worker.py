"""What runs in each worker process of a :class:`~shardcore.distributed.launcher.RankPool`: it joins the
process group, then runs the functions the pool sends (by reference, resolved in the worker) until told to stop.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["WORKER_ENV", "loads_payload", "main", "usable_cpus"]

WORKER_ENV = "SHARDCORE_RANK_WORKER"
_GUARD = (
    "a shardcore rank worker was asked to start ranks itself: the script {script!r} starts ranks "
    "(RankPool, run_on_ranks or shardcore.parallelize) at import time and a function or class it "
    "defines was sent to the ranks, so the worker ran the script to find it. Put the code that "
    'starts ranks under `if __name__ == "__main__":`, or define the function or class in an '
    "importable module."
)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the OS has one (a container or a
    ``taskset`` limits it below ``os.cpu_count()``, which counts the host's), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_MAIN_FILE: str | None = None  # in a worker: the caller's ``__main__`` script, if it has a file
_SCRIPT = None  # in a worker: that script, once loaded as ``__mp_main__``


def _script_module():
    """The caller's ``__main__`` script, loaded as ``__mp_main__`` (its guard, if any, skips the body)."""
    global _SCRIPT
    if _SCRIPT is None:
        if not _MAIN_FILE or not os.path.isfile(_MAIN_FILE):
            raise RuntimeError(
                "a function or class defined in an interactive session or notebook was sent to the ranks, "
                "which cannot import it; define it in a module (a .py file on sys.path) and import it from there"
            )
        spec = importlib.util.spec_from_file_location("__mp_main__", _MAIN_FILE)
        module = importlib.util.module_from_spec(spec)
        previous = sys.modules.get("__mp_main__")  # multiprocessing aliases it to the worker's __main__
        sys.modules["__mp_main__"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules["__mp_main__"] = previous
            raise
        _SCRIPT = module
    return _SCRIPT


def _lookup(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _Unpickler(pickle.Unpickler):
    """Finds what the caller pickled from its ``__main__`` in its script (see :func:`_script_module`)."""

    def find_class(self, module: str, name: str):
        if module == "__main__":
            return _lookup(_script_module(), name)
        return super().find_class(module, name)


def loads_payload(data: bytes):
    import io

    return _Unpickler(io.BytesIO(data)).load()


def _resolve(module_name: str, file: str | None, qualname: str) -> Callable:
    if module_name == "__main__":
        return _lookup(_script_module(), qualname)
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if file is None:
                raise
            spec = importlib.util.spec_from_file_location(module_name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    return _lookup(module, qualname)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def main() -> None:
    """Entry point of a worker process (``python -c``); its settings come in the environment."""
    import torch
    import torch.distributed as dist

    conn = Connection(int(os.environ.pop("SHARDCORE_RANK_FD")))
    parent = int(os.environ.pop("SHARDCORE_RANK_PARENT"))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    global _MAIN_FILE
    sys.path[:], _MAIN_FILE = pickle.loads(conn.recv_bytes())
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend, timeout_s = os.environ.pop("SHARDCORE_RANK_BACKEND"), float(os.environ.pop("SHARDCORE_RANK_TIMEOUT"))
    torch.set_num_threads(int(os.environ.pop("SHARDCORE_RANK_THREADS")))
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        backend = "cpu:gloo,cuda:nccl"  # distributed.CUDA_BACKEND: a CPU tensor goes over gloo, never NCCL
        from .watch import use_flight_recorder

        use_flight_recorder()
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            break
        try:
            task = loads_payload(message)
        except BaseException:
            conn.send_bytes(pickle.dumps(("err", traceback.format_exc())))
            continue
        if task is None:
            break
        module_name, file, qualname, args, kwargs, test = task
        if test:  # the caller's pytest test, for what the call records
            os.environ["PYTEST_CURRENT_TEST"] = test
        else:
            os.environ.pop("PYTEST_CURRENT_TEST", None)
        try:
            result = ("ok", _resolve(module_name, file, qualname)(*args, **kwargs))
            payload = pickle.dumps(result)
        except BaseException:  # report everything, including assertion failures
            payload = pickle.dumps(("err", traceback.format_exc()))
        conn.send_bytes(payload)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
