"""The rank launcher: run functions on N worker processes in one process group, kept alive between calls.

Spawning ranks costs seconds, so a :class:`RankPool` keeps ``world_size`` worker processes in one
process group (gloo; nccl for CUDA workers) and sends them work: the tests
(:mod:`shardcore.testing`), the benchmarks and :func:`shardcore.parallelize` use it.

How it differs from ``multiprocessing``, on purpose:

* Workers are fresh interpreters (``python -c``) connected by a private socket pair; they never
  import the caller's ``__main__``, so a script without an ``if __name__ == "__main__":`` guard
  does not re-run itself in every worker. Functions and classes sent to the ranks are found by
  module name; only when one was defined in the caller's ``__main__`` script is that script
  loaded, from its file, as ``__mp_main__`` (so the guard, if present, skips the script body).
  If that body starts ranks itself (no guard), the worker refuses with an error saying to add
  the guard: never a recursive spawn.
* Tasks and results travel as plain pickles, tensors by value: no shared memory (``/dev/shm`` is
  64 MB in many containers), no file descriptors passed between processes.
* Workers sit in their own session, so Ctrl+C reaches the caller only; the caller then kills
  them. A worker whose parent disappears exits within a second. A worker that dies makes the
  current call (or the next) raise :class:`RankError` at once, naming the rank and its exit
  signal, and the pool is closed; so is it when a rank does not answer in ``call_timeout``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from . import worker
from .worker import _GUARD, WORKER_ENV, _describe_exit, _free_port, usable_cpus

__all__ = ["RankError", "RankPool", "close_pools", "run_on_ranks"]


class RankError(RuntimeError):
    """A call failed on one or more ranks: ``tracebacks`` maps each failing rank to its traceback
    (or to why it gave no answer), and the message carries them all."""

    def __init__(self, message: str, tracebacks: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.tracebacks = dict(tracebacks or {})


def _worker_env(rank: int, world: int, port: int, fd: int, backend: str, timeout_s: float, threads: int) -> dict:
    """The environment of worker ``rank``: torch.distributed's rendezvous, shardcore's on this source tree."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        PYTHONPATH=os.pathsep.join([here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]),
        SHARDCORE_RANK_FD=str(fd),
        SHARDCORE_RANK_PARENT=str(os.getpid()),
        SHARDCORE_RANK_BACKEND=backend,
        SHARDCORE_RANK_TIMEOUT=str(timeout_s),
        SHARDCORE_RANK_THREADS=str(threads),
        **{WORKER_ENV: "1"},
    )


class RankPool:
    """``world_size`` worker processes in one process group, kept alive between calls.

    ``timeout_s`` bounds each collective (the process group's timeout); ``call_timeout`` bounds a
    whole :meth:`run` (default ``timeout_s + 30``; ``None``: no bound, a dead worker is still
    noticed at once). Once a rank has failed, the others get ``error_grace`` seconds to answer
    (they may be waiting in a collective the failed rank never joins). ``backend="nccl"`` gives
    worker ``r`` the CUDA device ``r``. ``quiet=True`` discards the output of every worker but
    the first (their warnings repeat its own; failures still come back as tracebacks).
    """

    def __init__(
        self,
        world_size: int,
        *,
        timeout_s: float = 300.0,
        threads: int | None = None,
        backend: str = "gloo",
        call_timeout: float | str | None = "default",
        error_grace: float = 10.0,
        quiet: bool = False,
    ) -> None:
        if os.environ.get(WORKER_ENV):
            raise RuntimeError(_GUARD.format(script=worker._MAIN_FILE or "__main__"))
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.call_timeout = timeout_s + 30 if call_timeout == "default" else call_timeout
        self.error_grace = error_grace
        threads = threads or max(1, usable_cpus() // world_size)
        port = _free_port()
        self._conns: list[Connection] = []
        self._procs: list[subprocess.Popen] = []
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        setup = pickle.dumps(
            ([os.path.abspath(p) if p else os.getcwd() for p in sys.path], main_file and os.path.abspath(main_file))
        )
        try:
            for rank in range(world_size):
                parent_sock, child_sock = socket.socketpair()
                env = _worker_env(rank, world_size, port, child_sock.fileno(), backend, timeout_s, threads)
                proc = subprocess.Popen(
                    [sys.executable, "-c", "from shardcore.distributed.worker import main; main()"],
                    env=env,
                    pass_fds=(child_sock.fileno(),),
                    start_new_session=True,  # Ctrl+C reaches the caller, which then stops the workers
                    stdout=subprocess.DEVNULL if quiet and rank else None,
                    stderr=subprocess.DEVNULL if quiet and rank else None,
                )
                child_sock.close()
                conn = Connection(parent_sock.detach())
                self._conns.append(conn)
                self._procs.append(proc)
                conn.send_bytes(setup)
        except BaseException:
            self.close(force=True)
            raise
        _LIVE.add(self)

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def run(self, fn: Callable, *args, **kwargs) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        Raises :class:`RankError` with every failing rank's traceback. When every rank answered
        (some with an error) the pool stays usable; when a rank died or gave no answer in time,
        the pool is closed (the others may be stuck in a collective) and :attr:`alive` is false.
        Ctrl+C (``KeyboardInterrupt``) closes the pool and is re-raised.
        """
        if not self._procs:
            raise RankError(f"the {self.world_size}-rank pool is closed")
        file = getattr(getattr(fn, "__code__", None), "co_filename", None)
        try:
            # the caller's running test goes along, so what a rank records (the kit's margins) names it
            test = os.environ.get("PYTEST_CURRENT_TEST")
            task = pickle.dumps((fn.__module__, file, fn.__qualname__, args, kwargs, test))
        except Exception as err:
            raise TypeError(f"cannot send {fn.__qualname__} and its arguments to the ranks: {err}") from err
        try:
            return self._run(fn.__qualname__, task)
        except KeyboardInterrupt:
            self.close(force=True)
            raise

    def _died(self, rank: int) -> str:
        return f"worker died ({_describe_exit(self._procs[rank].poll())})"

    def deaths(self) -> dict[int, str]:
        """``{rank: how it ended}`` of the workers that have exited (none once the pool is closed)."""
        return {rank: self._died(rank) for rank, proc in enumerate(self._procs) if proc.poll() is not None}

    def _run(self, name: str, task: bytes) -> list[Any]:  # noqa: C901, PLR0912
        results: list[Any] = [None] * self.world_size
        errors: dict[int, str] = {}
        pending = dict(enumerate(self._conns))
        for rank, conn in list(pending.items()):
            try:
                conn.send_bytes(task)
            except OSError:
                errors[rank] = self._died(rank)
                del pending[rank]
        deadline = None if self.call_timeout is None else time.monotonic() + self.call_timeout
        broken = bool(errors)
        first_error = None
        while pending and not broken:
            for conn in wait(list(pending.values()), timeout=0.5):
                rank = self._conns.index(conn)
                del pending[rank]
                try:
                    status, value = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._procs[rank].wait(timeout=5)
                    errors[rank] = self._died(rank)
                    broken = True
                    continue
                if status == "err":
                    errors[rank] = value
                results[rank] = value
            for rank in list(pending):
                if self._procs[rank].poll() is not None:
                    errors[rank] = self._died(rank)
                    del pending[rank]
                    broken = True
            if pending and deadline is not None and time.monotonic() > deadline:
                for rank in pending:
                    errors[rank] = f"no answer within {self.call_timeout:.0f} s"
                broken = True
            if pending and errors and not broken:
                first_error = first_error or time.monotonic()
                if time.monotonic() - first_error > self.error_grace:
                    for rank in pending:
                        errors[rank] = (
                            f"no answer {self.error_grace:.0f} s after another rank failed "
                            "(waiting in a collective the failed rank never joined)"
                        )
                    broken = True
        if broken:
            for rank in pending:
                errors.setdefault(rank, "stopped: another rank failed, this one was still running")
            self.close(force=True)
        if errors:
            state = "the pool is closed" if broken else "the pool is still usable"
            raise RankError(
                f"{name} failed on {len(errors)} of {self.world_size} ranks ({state}):\n"
                + "\n".join(f"rank {r}: {errors[r]}" for r in sorted(errors)),
                errors,
            )
        return results

    def close(self, *, force: bool = False) -> None:
        """Stop the workers (asking first unless ``force``; killing any that do not stop in 5 s)
        and reap them: no process of the pool remains after it returns."""
        if not force:
            for conn in self._conns:
                with contextlib.suppress(Exception):
                    conn.send_bytes(pickle.dumps(None))
        end = time.monotonic() + (0 if force else 5)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.close()
        self._procs.clear()
        self._conns.clear()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_LIVE: weakref.WeakSet[RankPool] = weakref.WeakSet()
_POOLS: dict[int, RankPool] = {}


def run_on_ranks(world_size: int, fn: Callable, *args, **kwargs) -> list[Any]:
    """Run module-level ``fn`` on ``world_size`` gloo ranks (a cached :class:`RankPool`)."""
    pool = _POOLS.get(world_size)
    if pool is None or not pool.alive:
        pool = _POOLS[world_size] = RankPool(world_size)
    try:
        return pool.run(fn, *args, **kwargs)
    finally:
        if not pool.alive:
            _POOLS.pop(world_size, None)


@atexit.register
def close_pools(world_size: int | None = None) -> None:
    """Shut every pool down (run at interpreter exit too); with ``world_size``, only the cached pool of that
    many ranks (a test of 8 ranks frees their memory for the rest of the run)."""
    if world_size is not None:
        pool = _POOLS.pop(world_size, None)
        if pool is not None:
            pool.close()
        return
    _POOLS.clear()
    for pool in list(_LIVE):
        pool.close()
