"""Benchmark (not a test): the cost model's compute alone against the clock, no parallelism in the way.

    python benchmarks/bench_compute.py [--models llama bert moe] [--seqs 128 512] [--ranks 1 2 4] [--steps 5]

``bench_auto.py`` scores whole layouts, where compute, communication and the shared cores' scheduling add up. Here
``n`` independent processes (1, 2 and 4: the profile's world sizes; one thread each, started together) each train
the unsharded model of ``bench_auto.py`` on one sequence of ``seq`` random tokens with AdamW, as a ``dp = n`` rank
does, without the gradients' all-reduce. A step ends when the slowest process's does (the median over ``--steps``
after a warm-up). The prediction is the cost model's for a ``dp = n`` DDP rank of the same workload less its
data-parallel communication: compute (FLOPs at the reference block's rate, the loss, the elementwise work beyond the
reference block's) and the optimizer step, from this machine's profile (``shardcore calibrate``, cached). Each
process's CPU seconds per step are recorded beside it. Writes ``bench-results/compute.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_auto import build, data


def worker(name: str, seq: int, steps: int) -> dict:
    """One process's step: forward, backward and AdamW on one sequence, its wall and CPU seconds."""
    torch.set_num_threads(1)
    model = build(name)
    part = data(name, 1, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    walls, cpus = [], []
    for step in range(steps + 1):
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        model(**part).loss.backward()
        opt.step()
        dist.barrier()  # the step ends with the slowest process
        if step:
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)
    return {"step_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
            "cpu_s": statistics.median(cpus)}  # fmt: skip


def predicted(name: str, seq: int, n: int, profile: dict) -> dict:
    """The cost model's step of a ``dp = n`` DDP rank on one sequence, less the data-parallel communication."""
    import shardcore
    from shardcore.cost.elementwise import trace
    from shardcore.cost.facts import hidden_size
    from shardcore.cost.model import predict
    from shardcore.cost.search import workload_facts

    with shardcore.init_empty():
        meta = build(name)
    layout = {"dp": n, "pp": 1, "sp": 1, "tp": 1, "ep": 1, "mode": None,
              "data_parallel": "ddp" if n > 1 else None, "microbatches": 1}  # fmt: skip
    facts = workload_facts(meta, layout, seq=seq, batch=n, traced=trace(meta, seq, hidden_size(meta)))
    row = predict(facts, layout, profile)
    return {"step_s": row["step_s"] - row["communication_s"]["dp"], "compute_s": row["compute_s"],
            "optimizer_s": row["optimizer_s"]}  # fmt: skip


def main() -> None:
    from shardcore.cost import load_profile
    from shardcore.testing import RankPool

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "bert", "moe"])
    parser.add_argument("--seqs", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="bench-results/compute.json")
    args = parser.parse_args()
    profile = load_profile()
    rows = []
    for n in args.ranks:
        with RankPool(n, timeout_s=3600, threads=1) as pool:
            for name in args.models:
                for seq in args.seqs:
                    ranks = pool.run(worker, name, seq, args.steps)
                    step = max(r["step_s"] for r in ranks)  # every process's barrier: equal, the slowest's
                    guess = predicted(name, seq, n, profile)
                    rows.append({"model": name, "seq": seq, "processes": n, "measured_s": step,
                                 "min_s": min(r["min_s"] for r in ranks), "max_s": max(r["max_s"] for r in ranks),
                                 "cpu_s_per_process": [r["cpu_s"] for r in ranks], "predicted": guess,
                                 "error": guess["step_s"] / step - 1})  # fmt: skip
                    print(f"{name} seq {seq}, {n} processes: measured {step:.3f} s, predicted {guess['step_s']:.3f} s "
                          f"({rows[-1]['error']:+.0%}); CPU per process {statistics.median(r['cpu_s'] for r in ranks):.3f} s")  # fmt: skip
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"profile": profile, "rows": rows}, indent=2))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
