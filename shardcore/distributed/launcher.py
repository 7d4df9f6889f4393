"""The rank launcher: run functions on N spawned gloo ranks, kept alive between calls.

Spawning ranks costs seconds, so a :class:`RankPool` keeps ``world_size`` worker processes in one
gloo process group and sends them work: the tests (:mod:`shardcore.testing`), the benchmarks and
one-process launches use it. A function sent to the ranks must be defined at module level; it is
found in the workers by module name or, failing that, by file path.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import multiprocessing as mp
import os
import socket
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

__all__ = ["RankError", "RankPool", "close_pools", "run_on_ranks"]


class RankError(AssertionError):
    """A function failed on one or more ranks; the message carries each rank's traceback."""


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resolve(module_name: str, file: str | None, qualname: str) -> Callable:
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
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker(rank: int, world_size: int, port: int, conn, timeout_s: float, threads: int) -> None:
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            break
        if task is None:
            break
        module_name, file, qualname, args, kwargs = task
        try:
            result = ("ok", _resolve(module_name, file, qualname)(*args, **kwargs))
        except BaseException:  # report everything, including assertion failures
            result = ("err", traceback.format_exc())
        conn.send(result)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


class RankPool:
    """``world_size`` spawned processes in one gloo process group, kept alive between calls."""

    def __init__(self, world_size: int, *, timeout_s: float = 300.0, threads: int | None = None) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        threads = threads or max(1, (os.cpu_count() or 1) // world_size)
        ctx = mp.get_context("spawn")
        port = _free_port()
        self._conns, self._procs = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, world_size, port, child, timeout_s, threads), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    @property
    def alive(self) -> bool:
        return all(p.is_alive() for p in self._procs)

    def run(self, fn: Callable, *args, **kwargs) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        Raises :class:`RankError` with every failing rank's traceback. After a failure the pool
        is closed (a rank may be stuck in a collective), and the next call gets a fresh one.
        """
        file = getattr(getattr(fn, "__code__", None), "co_filename", None)
        task = (fn.__module__, file, fn.__qualname__, args, kwargs)
        for conn in self._conns:
            conn.send(task)
        results, errors = [], []
        for rank, conn in enumerate(self._conns):
            if not conn.poll(self.timeout_s + 30):
                errors.append(f"rank {rank}: no answer within {self.timeout_s + 30:.0f} s")
                results.append(None)
                continue
            try:
                status, value = conn.recv()
            except EOFError:
                errors.append(f"rank {rank}: worker died (exit code {self._procs[rank].exitcode})")
                results.append(None)
                continue
            if status == "err":
                errors.append(f"rank {rank}:\n{value}")
            results.append(value)
        if errors:
            self.close()
            raise RankError(
                f"{fn.__qualname__} failed on {len(errors)} of {self.world_size} ranks:\n" + "\n".join(errors)
            )
        return results

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self._procs.clear()
        self._conns.clear()


_POOLS: dict[int, RankPool] = {}


def run_on_ranks(world_size: int, fn: Callable, *args, **kwargs) -> list[Any]:
    """Run module-level ``fn`` on ``world_size`` gloo ranks (a cached :class:`RankPool`)."""
    pool = _POOLS.get(world_size)
    if pool is None or not pool.alive:
        pool = _POOLS[world_size] = RankPool(world_size)
    try:
        return pool.run(fn, *args, **kwargs)
    finally:
        if not pool.alive or not pool._procs:
            _POOLS.pop(world_size, None)


@atexit.register
def close_pools() -> None:
    """Shut every cached pool down (also run at interpreter exit)."""
    while _POOLS:
        _POOLS.popitem()[1].close()
