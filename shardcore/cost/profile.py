"""``shardcore calibrate``: measure this machine once, for the cost model to predict step times.

A profile holds, for the device the ranks run on (CUDA when available, else the CPU) and the
backend that joins them (NCCL, gloo):

* ``matmul_flops``: the throughput of a square matmul per dtype (FLOP/s, one device; on the CPU
  with the calling process's ``matmul_threads``);
* ``collectives``: for each kind (``all_reduce``, ``all_gather``, ``reduce_scatter``,
  ``all_to_all``) and group size, the seconds per call at 4 KiB to 16 MiB per rank (calls back to
  back on every rank at once, each after a small matmul whose own time, timed in the same rounds, is
  taken off, the median of a few rounds: what a step meets between its computations, delays
  included) and their least-squares fit
  ``seconds = latency_s + bytes / bytes_per_s`` (bytes: what one rank contributes); keyed ``"g"``
  for a world of ``g`` ranks, and ``"g@n"`` for every group of ``g`` in a world of ``n`` at once
  (on a shared CPU, a 2-rank all-reduce among 4 ranks waits longer than among 2);
* ``per_rank``: for each group size, what one rank achieves while every rank of the group works at
  once (on a CPU the ranks share its cores): ``matmul_flops`` per dtype, ``block_flops`` per dtype
  (a pre-norm transformer block's forward and backward at width 512 on 2 x 256 tokens,
  :func:`~shardcore.cost.measure.block_step_flops` over its seconds: what a model's blocks
  achieve, norms, softmax and autograd included), ``block_shapes`` per dtype (a tensor-parallel
  rank's share of that block at 32, 128 and 512 tokens per microbatch and TP 1, 2, 4: its FLOP/s over
  the reference shape's, which is one of them; every shape timed in turn with every rank on it
  at once, five rounds of a second each, the median), ``optimizer_bytes_per_s`` (the
  parameter bytes an AdamW or SGD-with-momentum step updates per second, per tensor size in MiB:
  from a CPU's cache small tensors update several times faster per byte), ``copy_bytes_per_s`` (an
  elementwise pass over a 32 MiB tensor: bytes read + written per second), ``loss_elements_per_s`` (a
  cross-entropy's forward and backward on float32 logits of 128 to 4096 rows x 8192: logit elements per second,
  per logits' size in elements, as large logits leave a CPU's caches; a profile of one size is read as that rate
  at every size, one without it all the same, the cost model then pricing the loss as passes at the copy bandwidth),
  ``fresh_bytes_per_s`` (bytes written per second into a buffer just allocated, per size in MiB: on a CPU a buffer
  over the allocator's threshold comes as new pages, several times slower to write; a profile without it: the copy
  bandwidth), ``elementwise_bytes_per_s`` (an RMS norm, a gated SiLU and a residual add forward and backward,
  :class:`~shardcore.cost.elementwise.Chain`: bytes its ops read and write per second, keyed by the bytes per op, from
  32 to 16384 rows of 512; a profile without it: a step priced by its FLOPs alone), ``attention_shapes`` per dtype
  (scaled dot product attention's forward and backward at head dims 32, 64 and 128, masked and not, each rate over
  ``block_flops``, beside the reference block's own attention's and its share of the block's FLOPs,
  :mod:`~shardcore.cost.attention`; a profile without it: the attention at the block's rate) and ``send_recv``, the line fit
  of one rank swapping a message with its neighbour (a pipeline boundary);
* ``memory_bytes_per_rank``: what a rank may hold (free device memory; on the CPU the available
  memory shared by the ranks of the largest group measured).

Measured in seconds (a few sizes, a few repeats; matmuls: the median), written as JSON and cached under
``$SHARDCORE_CACHE`` (default ``~/.cache/shardcore``) by machine, device and backend:
:func:`load_profile` measures only when no profile is cached (or ``force``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import torch

from ..distributed.groups import new_group
from ..distributed.worker import usable_cpus
from .measure import _device, _rounds, _timed, fit_line

__all__ = ["KINDS", "calibrate", "fit_line", "load_profile", "profile_path"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
#: bytes one rank contributes, per measured point
SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
VERSION = 6


def profile_path(device: torch.device | None = None, backend: str | None = None) -> pathlib.Path:
    """Where this machine's profile for ``device``/``backend`` is cached."""
    if device is None:
        device, backend = _device()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    key = f"{platform.node()}|{name}|{usable_cpus()}|{torch.__version__}|{device.type}|{backend}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    root = pathlib.Path(os.environ.get("SHARDCORE_CACHE", pathlib.Path.home() / ".cache" / "shardcore"))
    return root / f"profile-{device.type}-{backend}-{digest}.json"


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` matmul on ``device`` in ``dtype``."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / _timed(lambda: a @ b, device, repeats)


def _collective(kind: str, nbytes: int, group, group_size: int, device: torch.device):
    """A call doing one ``kind`` collective over ``group`` where each rank contributes ``nbytes``:
    shardcore's own (:mod:`shardcore.distributed.collectives`), as a sharded model issues them."""
    from ..distributed import collectives as c

    numel = max(group_size, nbytes // 4 // group_size * group_size)
    x = torch.ones(numel, device=device)
    calls = {
        "all_reduce": lambda: c.all_reduce(x, group, where="calibrate"),
        "all_gather": lambda: c.all_gather_cat(x, group, 0, where="calibrate"),
        "reduce_scatter": lambda: c.reduce_scatter_cat(x, group, 0, where="calibrate"),
        "all_to_all": lambda: c.all_to_all_cat(x, group, 0, 0, where="calibrate"),
    }
    return calls[kind]


def _measure_collectives(sizes: tuple[int, ...], repeats: int) -> dict:
    """Run on every rank of a world: each kind at each size, over the whole world and over each
    smaller group size dividing it (every group of that size at once, as a layout's groups run);
    rank 0's timings, keyed ``"g"`` (the world) and ``"g@world"``."""
    import torch.distributed as dist

    device, _ = _device()
    world = dist.get_world_size()
    out: dict = {kind: {} for kind in KINDS}
    # each call after a little compute on every rank, as a step's collectives meet ranks between
    # their matmuls (on a shared CPU a peer may be off its core then), the compute's time taken off:
    # the compute alone timed in the same rounds, each round's difference, the median (a drift of
    # the machine's speed between the two would otherwise read as the collective's time)
    a = torch.randn(384, 384, device=device)
    for g in [g for g in range(2, world + 1) if world % g == 0]:
        groups = [new_group(list(range(i, i + g))) for i in range(0, world, g)] if g < world else None
        group = groups[dist.get_rank() // g] if groups else None
        calls = {"base": lambda: a @ a}
        for kind in KINDS:
            for nbytes in sizes:
                call = _collective(kind, nbytes, group, g, device)
                calls[kind, nbytes] = lambda call=call: (a @ a, call())
        # back to back, long enough that a rank's wait for a core is averaged in, not met once or missed
        times = _rounds(calls, device, max(3, repeats // 3), seconds=0.05)
        base = times.pop("base")
        floor = 0.01 * statistics.median(base)  # below the compute's own noise: not resolved, not zero
        for kind in KINDS:
            points = []
            for nbytes in sizes:
                runs = [t - b for t, b in zip(times[kind, nbytes], base, strict=True)]
                points.append((nbytes, max(statistics.median(runs), floor)))
            latency, bandwidth = fit_line(points)
            out[kind][str(g) if g == world else f"{g}@{world}"] = {
                "latency_s": latency,
                "bytes_per_s": bandwidth,
                "points": points,
            }
    return out


def _memory_per_rank(device: torch.device, ranks: int) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = pathlib.Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // max(ranks, 1)
    return 0


def calibrate(
    group_sizes: tuple[int, ...] = (2,),
    *,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
    sizes: tuple[int, ...] = SIZES,
    repeats: int = 9,
    out: str | pathlib.Path | None = None,
    progress: bool = True,
) -> dict:
    """Measure this machine (see the module docstring) and write the profile to ``out`` (default
    :func:`profile_path`); returns it. Collectives run on ``group_sizes`` fresh local ranks each.
    ``progress``: each stage announced on stderr. A busy machine is measured slowly, never given up on."""
    from ..distributed.launcher import RankPool
    from .measure import measure_per_rank

    device, backend = _device()
    devices = torch.cuda.device_count() if device.type == "cuda" else None
    for n in group_sizes:
        if n < 2 or (devices is not None and n > devices):
            raise ValueError(f"calibrate: group size {n} must be at least 2 (and at most the {devices} GPUs here)")
    start = time.perf_counter()
    say = _announcer(progress, start)
    say(f"matmul rates ({', '.join(str(d).removeprefix('torch.') for d in dtypes)})")
    profile = {
        "version": VERSION,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "backend": backend,
        "torch": torch.__version__,
        "cpu_count": usable_cpus(),
        "matmul_flops": {str(d).removeprefix("torch."): matmul_flops(device, d, repeats=repeats) for d in dtypes},
        "matmul_threads": torch.get_num_threads(),
        "collectives": {kind: {} for kind in KINDS},
        "per_rank": {},
    }
    for n in group_sizes:  # each rank with its share of the CPU's threads, as a launched job would
        threads = max(1, usable_cpus() // n)  # no call deadline: each collective's own 120 s bound
        pool = RankPool(n, timeout_s=120, threads=threads, backend=backend, call_timeout=None)
        try:
            say(f"collectives over {n} ranks ({', '.join(KINDS)}; {len(sizes)} sizes each)")
            measured = pool.run(_measure_collectives, sizes, repeats)[0]
            names = tuple(str(d).removeprefix("torch.") for d in dtypes)
            say(f"each of {n} ranks' compute, optimizer and point-to-point rates")
            per_rank = pool.run(measure_per_rank, sizes, repeats, names)
        finally:
            pool.close()
        for kind, fits in measured.items():
            profile["collectives"][kind].update(fits)
        slowest = min(per_rank, key=lambda r: min(r["matmul_flops"].values()))  # a step waits for the slowest
        profile["per_rank"][str(n)] = slowest
    profile["memory_bytes_per_rank"] = _memory_per_rank(device, max(group_sizes))
    profile["seconds"] = time.perf_counter() - start
    path = pathlib.Path(out) if out else profile_path(device, backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2))
    profile["path"] = str(path)
    say(f"done: {path}")
    return profile


def _announcer(on: bool, start: float):
    """``say(stage)``: one line on stderr per stage with the seconds since ``start`` (nothing when off)."""

    def say(stage: str) -> None:
        if on:
            print(f"shardcore calibrate [{time.perf_counter() - start:5.1f} s]: {stage}", file=sys.stderr, flush=True)

    return say


def load_profile(
    path: str | pathlib.Path | None = None,
    *,
    force: bool = False,
    group_sizes: tuple[int, ...] = (2,),
    measure: bool = True,
    replace: bool = False,
) -> dict:
    """The cached profile at ``path`` (default :func:`profile_path`); measured first when there is
    none, when it is of another version, or with ``force``. ``measure=False`` (inside a job, whose
    ranks must not start ranks of their own): ``FileNotFoundError`` naming the command instead. A file
    named by ``path`` that is of another version is refused (``ValueError``), never measured over: it
    may be a committed or shared profile; ``replace`` (``shardcore calibrate --out FILE``) measures it again."""
    target = pathlib.Path(path) if path else profile_path()
    if not force and target.exists():
        cached = json.loads(target.read_text())
        if cached.get("version") == VERSION:
            cached["path"] = str(target)
            return cached
        if path and measure and not replace:
            raise ValueError(
                f"the machine profile {target} is of another shardcore version ({cached.get('version')}; this one "
                f"reads {VERSION}) and is not measured over, since it was named: `shardcore calibrate --out "
                f"{target}` measures this machine into it, or name another file"
            )
    what = (
        ("is measured again" if force else "is of another shardcore version") if target.exists() else "does not exist"
    )
    if not measure:
        raise FileNotFoundError(
            f"the machine profile {target} {what}: run `shardcore calibrate --world 2 <ranks per node>` "
            "once on this machine (outside the job), or pass the profile's path"
        )
    print(f"shardcore: the machine profile {target} {what}: measuring it first", file=sys.stderr, flush=True)
    return calibrate(group_sizes, out=target)
