"""A run that finished exits 0 on every rank: the works of shardcore's last collectives are kept for
the rest of the process (``shardcore.distributed.retain``), so no process group's worker thread
destroys one during the interpreter's finalization (where it would need the GIL, and ``take_gil``
ends the thread: ``terminate called without an active exception``). The kept works are bounded:
the last few per group, not one per step."""

from __future__ import annotations

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
