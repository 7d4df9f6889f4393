"""Benchmark (not a test): can a gloo collective run beside a matmul on this machine?

    python benchmarks/bench_overlap_probe.py [--rows 2048] [--hidden 512] [--out-features 1408] [--reps 20] [--out F]

Two gloo ranks, one thread each. ``serial``: all-gather this rank's ``rows x hidden`` slice,
then one matmul of the gathered input (what ``split_gather`` does); ``overlapped``: start the
all-gather, multiply this rank's slice meanwhile, wait, multiply the other slice (what an
overlapping implementation does). Also the all-gather and the matmul alone. Prints the median
of five rounds of ``--reps`` repetitions each, alternating the two, and their ratio: below 1
means the collective progresses while the matmul runs. ``--out`` also writes the figures as JSON
(``nox -s bench-overlap`` runs it 3 times into ``benchmarks/results/overlap_probe.json``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist


def probe(rows: int, hidden: int, out_features: int, reps: int) -> dict:
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, w = torch.randn(rows, hidden), torch.randn(out_features, hidden)

    def serial():
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        return torch.cat(parts) @ w.t()

    def overlapped():
        parts = [torch.empty_like(x) for _ in range(world)]
        work = dist.all_gather(parts, x, async_op=True)
        outs = {rank: x @ w.t()}
        work.wait()
        outs.update({j: parts[j] @ w.t() for j in range(world) if j != rank})
        return torch.cat([outs[j] for j in range(world)])

    def gather_only():
        dist.all_gather([torch.empty_like(x) for _ in range(world)], x)

    def matmul_only():
        return torch.cat([x] * world) @ w.t()

    assert torch.allclose(serial(), overlapped())
    times: dict[str, list[float]] = {}
    for _ in range(5):
        for fn in (serial, overlapped, gather_only, matmul_only):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            dist.barrier()
            times.setdefault(fn.__name__, []).append((time.perf_counter() - start) / reps * 1e3)
    return {name: statistics.median(ms) for name, ms in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--out-features", type=int, default=1408)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", help="also write the figures (ms) to this JSON file")
    args = parser.parse_args()
    from shardcore.testing import RankPool

    pool = RankPool(2, timeout_s=600, threads=1)
    try:
        ms = pool.run(probe, args.rows, args.hidden, args.out_features, args.reps)[0]
    finally:
        pool.close()
    mb = args.rows * args.hidden * 4 / 2**20
    print(
        f"all-gather of {mb:.0f} MB per rank beside a {args.rows} x {args.hidden} by {args.hidden} x "
        f"{args.out_features} matmul per slice, 2 gloo ranks x 1 thread (ms, median of 5 rounds)"
    )
    for name, value in ms.items():
        print(f"  {name:12s} {value:8.1f}")
    print(f"  overlapped / serial = {ms['overlapped'] / ms['serial']:.2f}x")
    if args.out:
        import json
        import pathlib

        sizes = {"rows": args.rows, "hidden": args.hidden, "out_features": args.out_features, "reps": args.reps}
        ratio = ms["overlapped"] / ms["serial"]
        pathlib.Path(args.out).write_text(json.dumps({**sizes, "ms": ms, "overlapped_over_serial": ratio}, indent=2))


if __name__ == "__main__":
    main()
