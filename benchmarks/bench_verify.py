"""Benchmark (not a test): what ``ShardConfig(verify=True)`` costs on the bench model (the Llama of
``bench_llama_tp.py``, TP=2 on 2 gloo ranks, batch 4 x 256 tokens): ``optimize``'s seconds, the first
step's and the steady state's, with the checks off and on, and the collectives each adds.

    python benchmarks/bench_verify.py [--seq 256] [--steps 5] [--out PATH]
    python benchmarks/repeat.py --name verify -- python benchmarks/bench_verify.py

The steady state must not change (the first-step hooks are gone after the first backward); the
checks cost a fixed amount at ``optimize`` (one unsharded forward on 2 x 8 tokens, one block of each
kind forward and backward twice, the sharded model's forward) and at the first backward (one
all-gather). Ratios are to the same run with the checks off, which takes turns with it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _one(verify: bool, seq: int, steps: int) -> dict:
    import torch

    import shardcore
    from shardcore.distributed.collectives import count_collectives

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_llama_tp import BATCH, build

    torch.set_num_threads(1)
    model = build()
    start = time.perf_counter()
    with count_collectives() as at_optimize:
        model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=2, verify=verify))
    optimize_s = time.perf_counter() - start
    ids = torch.randint(0, 8192, (BATCH, seq), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        times.append(time.perf_counter() - start)
    return {
        "optimize_s": optimize_s,
        "first_step_s": times[0],
        "steady_step_s": statistics.median(times[1:]),
        "collectives_at_optimize": dict(at_optimize),
    }


def run(seq: int, steps: int) -> dict:
    """On each rank: the checks off, on, off, on (taking turns), the medians of each."""
    rounds = {False: [], True: []}
    for verify in (False, True, False, True):
        rounds[verify].append(_one(verify, seq, steps))
    out = {}
    for verify, runs in rounds.items():
        out["on" if verify else "off"] = {
            k: statistics.median(r[k] for r in runs) if k.endswith("_s") else runs[0][k] for k in runs[0]
        }
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "verify.json"))
    args = parser.parse_args(argv)
    from shardcore.testing import close_pools, run_on_ranks

    try:
        result = run_on_ranks(2, run, args.seq, args.steps)[0]
    finally:
        close_pools()
    off, on = result["off"], result["on"]
    result["ratios_on_to_off"] = {k: on[k] / off[k] for k in ("optimize_s", "first_step_s", "steady_step_s")}
    result["added_s"] = {k: on[k] - off[k] for k in ("optimize_s", "first_step_s", "steady_step_s")}
    result.update({"seq": args.seq, "batch": 4, "tp": 2, "model": "bench_llama_tp.CONFIG"})
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for k in ("optimize_s", "first_step_s", "steady_step_s"):
        print(f"{k:15s} off {off[k]:.3f}  on {on[k]:.3f}  ratio {result['ratios_on_to_off'][k]:.2f}")
    print("collectives at optimize: off", off["collectives_at_optimize"], "on", on["collectives_at_optimize"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
