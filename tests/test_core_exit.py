"""A run that finished exits 0 on every rank: the works of shardcore's last collectives are kept for
the rest of the process (``shardcore.distributed.retain``), so no process group's worker thread
destroys one during the interpreter's finalization (where it would need the GIL, and ``take_gil``
ends the thread: ``terminate called without an active exception``). The kept works are bounded:
the last few per group, not one per step."""

from __future__ import annotations

import ast
import pathlib

import torch

from shardcore.testing import run_on_ranks


def _collectives(steps: int) -> dict:
    import torch.distributed as dist

    from shardcore.distributed import collectives, objects, retain

    group = dist.group.WORLD
    counts = []
    for _ in range(steps):
        collectives.all_reduce(torch.ones(8), group, where="test")
        collectives.all_gather_cat(torch.ones(2, 3), group, 0, where="test")
        counts.append(retain.kept(group))
    objects.barrier(group, where="test")
    return {"counts": counts, "after_barrier": retain.kept(group), "keep": retain.KEEP}


def test_the_last_works_of_each_group_are_kept_and_bounded():
    """Every collective shardcore waits for is kept (the barrier too, with the works it waited for);
    after many steps no more than KEEP per group: the count is flat, not growing with the steps."""
    for result in run_on_ranks(2, _collectives, 20):
        keep, counts = result["keep"], result["counts"]
        assert counts[-1] == keep and max(counts) == keep, f"kept works per group: {counts}"
        assert result["after_barrier"] == keep, result


def test_the_watch_s_thread_is_joined_before_the_interpreter_finalizes():
    """NCCL's watch thread (shardcore's only thread in a training process) stops and is joined by an
    atexit hook, not left running into finalization (where a thread inside a CUDA call could abort)."""
    import atexit

    from shardcore.distributed import watch

    class Work:
        def is_completed(self) -> bool:
            return False

    w = watch.Watch(period_s=3600)
    hooks = atexit._ncallbacks()
    w.enter(Work(), torch.device("cpu"), 60.0, lambda what: what)
    w.enter(Work(), torch.device("cpu"), 60.0, lambda what: what)
    assert w._thread.is_alive() and atexit._ncallbacks() == hooks + 1, "the watch's exit hook is not registered once"
    w.stop()  # what the hook runs at exit
    assert not w._thread.is_alive(), "the watch's thread outlived its stop"
    atexit.unregister(w.stop)


ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the files that unpickle, and why: parallelize's processes talk to one another over their own pipes
UNPICKLING = {"shardcore/distributed/launcher.py", "shardcore/distributed/worker.py"}


def _calls(name: str) -> list[tuple[str, ast.Call]]:
    found = []
    files = [*ROOT.glob("shardcore/**/*.py"), *ROOT.glob("plugins/*/shard_*/**/*.py")]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == name:
                found.append((str(path.relative_to(ROOT)), node))
    return found


def test_every_torch_load_reads_weights_only():
    """docs/checkpoints.md's table: a torch.load that could run a file's code is a new, named failure."""
    calls = _calls("torch.load")
    assert calls, "no torch.load found: the check looks at nothing"
    unsafe = [
        f"{f}:{c.lineno}"
        for f, c in calls
        if not any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in c.keywords)
    ]
    assert not unsafe, f"torch.load without weights_only=True: {unsafe}"


def test_pickle_is_read_only_between_parallelize_s_own_processes():
    readers = {f for name in ("pickle.loads", "pickle.load", "pickle.Unpickler") for f, _ in _calls(name)}
    assert readers <= UNPICKLING, f"unpickling outside parallelize's pipes: {sorted(readers - UNPICKLING)}"
    assert readers, "no unpickling found: the allow-list names files that no longer unpickle"


def _settled() -> dict:
    import torch.distributed as dist

    from shardcore.distributed import retain

    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(4))  # the script's own collectives, not shardcore's: settled at exit
    dist.all_reduce(torch.ones(4), group=sub)
    return {"settled": retain.settle_at_exit(), "gloo": len(retain._gloo_groups())}


def test_the_exit_hook_settles_every_gloo_group_with_a_kept_barrier():
    """What the atexit hook does before the interpreter finalizes: one barrier per gloo group this
    rank is in (the world and a sub-group here), each completed and kept."""
    for result in run_on_ranks(2, _settled):
        assert result["gloo"] >= 2 and result["settled"] == result["gloo"], f"the exit barrier settled {result}"
