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
    model = _toy(timeout=1)
    batch = toy_batch(128)
    model(**batch)  # both ranks: the input check's forward
    if dist.get_rank() == 0:  # the user's `if rank == 0: model(...)`
        reports = len(watch.REPORTS)
        with as_watchdog_backend(), pytest.raises(CollectiveTimeout) as err:
            model(**batch)  # not bounded on the host: gloo's own group timeout (4 s) ends it here
        (report,) = watch.REPORTS[reports:]
        assert "waited past the process group's timeout" in str(err.value), err.value  # not the 1 s bound
        return report
    time.sleep(2)  # rank 0's group timeout (4 s) ends first: not a peer that gave up before it
    try:
        dist.barrier()
    except RuntimeError as err:
        return f"barrier: {err}"
    return "barrier returned"


def test_a_hang_on_a_watchdog_backend_is_named_at_the_bound():
    pool = RankPool(2, timeout_s=4)  # a group of its own: it ends broken
    try:
        report, other = pool.run(_hang_named_by_the_watch)
    finally:
        pool.close(force=True)
    assert re.search(
        r"\(forward of embed \(VocabParallelEmbedding1D\)\) has not finished after \d+ s \(the bound is 1 s\)", report
    )
    assert (
        "still waiting for the other ranks of its tensor-parallel group [0, 1]" in report
        and "`if rank == 0:` is the usual mistake" in report
    )
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


def _collectives_along_every_dim() -> str:
    from shardcore.distributed.collectives import all_gather_cat, all_to_all_cat, reduce_scatter_cat

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    xs = [torch.randn(2, world * 3, world * 2, 5) for _ in range(world)]
    for dim in range(4):
        assert torch.equal(all_gather_cat(xs[rank], None, dim), torch.cat(xs, dim)), f"all-gather along {dim}"
        if xs[rank].shape[dim] % world == 0:
            got, want = reduce_scatter_cat(xs[rank], None, dim), sum(xs).chunk(world, dim)[rank]
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6), f"reduce-scatter along {dim}"
    for scatter, gather in [(1, 2), (2, 1), (1, 0), (-2, -3), (2, 3)]:
        want = torch.cat([x.chunk(world, scatter)[rank] for x in xs], gather)
        assert torch.equal(all_to_all_cat(xs[rank], None, scatter, gather), want), f"all-to-all {scatter}->{gather}"
    return "ok"


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_collectives_match_lists_and_cat_along_every_dimension(world):
    assert run_on_ranks(world, _collectives_along_every_dim) == ["ok"] * world


def _copies_of_a_gather_along_vocab() -> list[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    from shardcore.distributed.collectives import all_gather_cat

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._overloadpacket in (torch.ops.aten.copy_, torch.ops.aten.clone, torch.ops.aten.cat):
                self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    rank, world = dist.get_rank(), dist.get_world_size()
    local = torch.full((2, 3, 4), float(rank))  # [batch, tokens, this rank's vocabulary slice]
    with Copies() as mode:
        full = all_gather_cat(local, None, -1)
    assert torch.equal(full, torch.cat([torch.full((2, 3, 4), float(r)) for r in range(world)], -1))
    return mode.seen


def test_a_gloo_gather_along_a_later_dimension_writes_the_result_without_a_reordering_copy():
    """On gloo a gather along the vocabulary (the logits' last dimension) is written by the
    collective straight into the result's slices: no copy on the caller's thread (the tensor
    collective's flat buffer would need one, 2 x the logits' bytes at every step)."""
    assert run_on_ranks(2, _copies_of_a_gather_along_vocab) == [[], []]


def test_a_gather_along_the_sequence_of_one_sequence_is_a_view_of_the_buffer():
    """One flat buffer per collective: gathering along dimension 0, or along the sequence of a
    batch of one (the long-sequence case), returns the buffer the collective wrote, not a copy."""
    from shardcore.distributed.collectives import _from_blocks

    flat = torch.arange(2 * 3 * 4.0).view(2, 3, 4)  # two ranks' [1, 3, 4] blocks
    assert _from_blocks(flat, 2, 0).data_ptr() == flat.data_ptr()
    seq = _from_blocks(flat, 2, 1)  # [batch 1, 3 positions per rank, 4] gathered along the sequence
    assert seq.shape == (1, 6, 4) and seq._base is not None and seq.data_ptr() == flat.data_ptr()
    assert torch.equal(seq, torch.cat([flat[0:1], flat[1:2]], dim=1))


class _ReadsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        grad.sum().item()  # a host read in a backward
        return grad * 2


def _reads_of(fn) -> list[tuple[str, str]]:
    with record_syncs(packages=(__name__.split(".")[0],)) as found:
        fn()
    return [(s.kind, s.site.rsplit(" ", 1)[1]) for s in found]


def test_the_audit_sees_reads_in_the_forward_and_in_the_backward_of_the_packages_it_audits():
    x = torch.ones(3, requires_grad=True)

    def step():
        y = _ReadsInBackward.apply(x)
        bool(y.sum() > 0)
        y.tolist()
        y.sum().backward()

    assert _reads_of(step) == [("__bool__", "(step)"), ("tolist", "(step)"), ("_local_scalar_dense", "(backward)")]
    assert _reads_of(lambda: torch.ones(2).sum().item()) == [("item", "(<lambda>)")]
    with record_syncs(packages=("elsewhere",)) as found:  # code of other packages is not counted
        step()
    assert found == []


def _what_the_audits_see() -> dict:
    from shardcore.distributed import objects
    from shardcore.distributed.audit import DeviceAuditError
    from shardcore.distributed.collectives import all_reduce
    from shardcore.testing import device_strict

    with record_syncs(packages=(__name__.split(".")[0],)) as found:
        objects.barrier(None, where="the test's barrier")
        objects.all_gather_object(dist.get_rank(), None, where="the test's gather")
    seen = {"host syncs": [s.kind for s in found if s.kind in ("barrier", "all_gather_object")]}
    with device_strict("cpu"):
        made = torch.empty(2)  # made without a device: where a GPU run would have put it on the CPU
        try:
            all_reduce(made, None, where="the test's buffer")
            seen["refused"] = "nothing"
        except DeviceAuditError as exc:
            seen["refused"] = str(exc)
    seen["device"] = str(made.device)
    all_reduce(torch.ones(2), None, where="after the audit")  # the audit ends with its block
    return seen


def test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device():
    """The two audits the wrapper feeds, each shown to fail: the sync audit hears a barrier and an
    object collective (they block the host), the device-strict audit refuses a buffer made without a
    device (on ``meta`` inside it), naming the collective and where it was called."""
    for seen in run_on_ranks(2, _what_the_audits_see):
        assert seen["host syncs"] == ["barrier", "all_gather_object"], f"the sync audit heard {seen['host syncs']}"
        assert seen["device"] == "meta", seen
        assert "all_reduce (the test's buffer) got a tensor on meta" in seen["refused"], (
            f"the device-strict audit let a tensor on meta reach all_reduce: refused {seen['refused']!r}"
        )
