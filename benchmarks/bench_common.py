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


def slowest(seconds: float, device: torch.device | str = "cpu") -> float:
    """The largest of the ranks' ``seconds``: a parallel step ends when its slowest rank does
    (``device``: where the backend takes tensors, a GPU for NCCL)."""
    t = torch.tensor([seconds], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
