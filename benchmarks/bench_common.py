"""What the benchmarks share: this process's memory figures and the slowest rank's time."""

from __future__ import annotations

import pathlib

import torch
import torch.distributed as dist


def rss_kb(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` (peak) of this process in kB, from ``/proc/self/status``."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def slowest(seconds: float) -> float:
    """The largest of the ranks' ``seconds``: a parallel step ends when its slowest rank does."""
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
