"""On a watchdog backend (NCCL) shardcore's collectives never block the host: no ``wait(timeout)``;
a collective the other ranks never join is still named, by the watch, at the bound."""

from __future__ import annotations

import re
import time

import pytest
import torch
import torch.distributed as dist
from toy_models import ToyLM, ToyPolicy, toy_batch

import shardcore
from shardcore import ShardConfig
from shardcore.distributed import watch
from shardcore.distributed.collectives import CollectiveTimeout
from shardcore.testing import RankPool, as_watchdog_backend, record_syncs, run_on_ranks


def _toy(timeout: float | None = None) -> ToyLM:
    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=dist.get_world_size(), collective_timeout=timeout)
    return shardcore.optimize(ToyLM(vocab=128), config, policy=ToyPolicy)


def _waits(watchdog: bool) -> list[str]:
    model = _toy()
    model(**toy_batch(128))  # the input check's forward
    with record_syncs() as found:
        if watchdog:
            with as_watchdog_backend():
                model(**toy_batch(128))["loss"].backward()
        else:
            model(**toy_batch(128))["loss"].backward()
    return [f"{s.kind} {s.site}" for s in found]


def test_gloo_waits_on_the_host_within_the_bound_and_nccl_does_not():
    on_gloo, on_nccl = run_on_ranks(2, _waits, False)[0], run_on_ranks(2, _waits, True)[0]
    assert on_gloo and all(s.startswith("wait(timeout) shardcore/distributed/collectives.py:") for s in on_gloo)
    assert on_nccl == []


def _hang_named_by_the_watch() -> str:
    model = _toy(timeout=2)
    batch = toy_batch(128)
    model(**batch)  # both ranks: the input check's forward
    if dist.get_rank() == 0:  # the user's `if rank == 0: model(...)`
        reports = len(watch.REPORTS)
        start = time.monotonic()
        with as_watchdog_backend(), pytest.raises(CollectiveTimeout) as err:
            model(**batch)  # not bounded on the host: gloo's own group timeout (6 s) ends it here
        seconds = time.monotonic() - start
        assert seconds > 5, seconds
        (report,) = watch.REPORTS[reports:]
        assert "waited" in str(err.value)
        return report
    try:
        dist.barrier()
    except RuntimeError as err:
        return f"barrier: {err}"
    return "barrier returned"


def test_a_hang_on_a_watchdog_backend_is_named_at_the_bound():
    pool = RankPool(2, timeout_s=6)  # a group of its own: it ends broken
    try:
        report, other = pool.run(_hang_named_by_the_watch)
    finally:
        pool.close(force=True)
    assert re.search(
        r"\(forward of embed \(VocabParallelEmbedding1D\)\) has not finished after \d+ s \(the bound is 2 s\)", report
    )
    assert "of its tensor-parallel group [0, 1]" in report and "`if rank == 0:` is the usual mistake" in report
    assert other.startswith("barrier: ")


class _Work:
    def __init__(self) -> None:
        self.done = False

    def is_completed(self) -> bool:
        return self.done


def test_the_watch_reports_the_oldest_unfinished_collective_once():
    w = watch.Watch(period_s=3600)  # polled by hand here
    first, second = _Work(), _Work()
    w.enter(first, torch.device("cpu"), 0.05, lambda what: f"first {what}")
    w.enter(second, torch.device("cpu"), 0.05, lambda what: f"second {what}")
    assert w.check() is None  # within the bound
    time.sleep(0.1)
    assert w.check().startswith("first has not finished after")
    assert w.check() is None  # reported once
    first.done = True
    assert w.check().startswith("second has not finished")
    second.done = True
    assert w.check() is None and not w._pending
