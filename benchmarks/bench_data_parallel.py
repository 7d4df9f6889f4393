"""Benchmark (not a test): data parallelism on the mesh, 4 gloo ranks, the Llama bench model.

    python benchmarks/bench_data_parallel.py [--batch 8] [--seq 256] [--steps 5] [--warmup 2]

Starts 4 gloo ranks (1 thread each; this machine has 2 cores, so the ranks share them) and trains
the Llama bench model of ``bench_llama_tp.py`` with AdamW on one global batch, laid out as:

* ``TP=4``: tensor parallel over the 4 ranks, every rank runs the whole batch;
* ``FSDPxTP 2x2``: ``ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="fsdp")``;
* ``DDPxTP 2x2``: the same with ``data_parallel="ddp"``;
* ``FSDP=4``: ``tensor_parallel_size=1, data_parallel_size=4, data_parallel="fsdp"``;
* ``unsharded``: the whole model, whole batch, on one of the ranks (the others wait).

Each layout builds the model on the meta device (:func:`shardcore.init_empty`), shards it and
loads one checkpoint (written once by this script), so no rank ever holds the whole model, then
runs ``--warmup`` + ``--steps`` optimizer steps (each data-parallel rank on its part of the
batch). Measured per rank: the step time (median; a step ends when the slowest rank does), the
peak RSS over the run (``VmHWM``, reset before each layout) and its increase over the RSS before
the layout started (after one unmeasured TP=4 step that takes the one-time costs), and the
bytes of parameters + AdamW state it holds. The first step's loss
(mean over the data-parallel ranks) must equal the unsharded loss (relative 1e-4) or the run
stops. Times are also given as ratios to TP=4 in the same run. Writes ``bench-results/data_parallel.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_llama_tp import CONFIG, build

LAYOUTS = {
    "TP=4": {"tensor_parallel_size": 4},
    "FSDPxTP 2x2": {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"},
    "DDPxTP 2x2": {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "ddp"},
    "FSDP=4": {"tensor_parallel_size": 1, "data_parallel_size": 4, "data_parallel": "fsdp"},
    "unsharded": None,
}


def _rss_kb(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def worker(args, checkpoint: str) -> list[dict]:
    import gc

    import shardcore
    from shardcore.testing import dp_part, state_bytes

    rank = dist.get_rank()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (args.batch, args.seq), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    results = []
    # a first, unmeasured TP=4 step: one-time costs (lazy imports, first collectives) out of the figures
    for name, layout in [("warm-up", LAYOUTS["TP=4"]), *LAYOUTS.items()]:
        gc.collect()
        dist.barrier()
        pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current RSS
        before = _rss_kb("VmRSS")
        active = layout is not None or rank == 0
        times, first_loss, held = [], None, 0
        if active:
            with shardcore.init_empty():
                model = build()
            if layout is not None:
                model = shardcore.optimize(model, shardcore.ShardConfig(**layout))
            shardcore.load_checkpoint(model, checkpoint)
            mine = batch
            if layout is not None and layout.get("data_parallel"):
                coords = model.shardcore.layout.coordinates(rank)
                mine = dp_part(batch, coords["dp"], model.shardcore.layout.dp)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            for step in range(1 if name == "warm-up" else args.warmup + args.steps):
                if layout is not None:
                    dist.barrier()
                start = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss = model(**mine).loss
                loss.backward()
                opt.step()
                if step >= args.warmup:
                    times.append(time.perf_counter() - start)
                if step == 0:
                    first_loss = loss.detach()
            held = state_bytes(model, opt)
            del model, opt
        if name == "warm-up":
            continue
        if layout is not None:
            dp = layout.get("data_parallel_size", 1) if layout.get("data_parallel") else 1
            total = first_loss.clone()
            dist.all_reduce(total)  # sum over all ranks; each TP group repeats its dp rank's loss tp times
            first = total.item() / dist.get_world_size()
            step_s = _slowest(statistics.median(times))
        else:
            dp, first = 1, (first_loss.item() if rank == 0 else 0.0)
            step_s = statistics.median(times) if rank == 0 else 0.0
        peak = _rss_kb("VmHWM")
        row = {"layout": name, "rank": rank, "dp": dp, "loss": first, "step_s": step_s}
        row.update(peak_rss_mb=peak / 1024, rss_increase_mb=(peak - before) / 1024, state_mb=held / 2**20)
        results.append(row)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    return [r for rows in gathered for r in rows] if rank == 0 else []


def report(results: list[dict], args, out: pathlib.Path) -> None:
    ref = next(r for r in results if r["layout"] == "unsharded" and r["rank"] == 0)
    for r in results:
        if r["layout"] != "unsharded" and abs(r["loss"] - ref["loss"]) > 1e-4 * abs(ref["loss"]):
            raise AssertionError(f"{r['layout']}: first loss {r['loss']:.6f} != unsharded {ref['loss']:.6f}")
    tp4 = next(r for r in results if r["layout"] == "TP=4")["step_s"]
    print(f"\nLlama bench model {CONFIG}, AdamW, global batch {args.batch} x seq {args.seq}")
    print("4 gloo ranks x 1 thread on this machine's 2 cores; unsharded: one process, one thread\n")
    print("| layout | step s | vs TP=4 | per-rank peak RSS MB (max) | its increase MB | params+AdamW MB/rank |")
    print("|---|---|---|---|---|---|")
    for name in LAYOUTS:
        rows = [r for r in results if r["layout"] == name and (name != "unsharded" or r["rank"] == 0)]
        step = rows[0]["step_s"]
        print(
            f"| {name} | {step:.3f} | {step / tp4:.2f}x | {max(r['peak_rss_mb'] for r in rows):.0f} | "
            f"{max(r['rss_increase_mb'] for r in rows):.0f} | {max(r['state_mb'] for r in rows):.1f} |"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": CONFIG, "batch": args.batch, "seq": args.seq, "results": results}, indent=2))
    print(f"\nwritten: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="bench-results/data_parallel.json")
    args = parser.parse_args()
    from shardcore.testing import RankPool

    with tempfile.TemporaryDirectory() as tmp:
        build().save_pretrained(tmp)  # one checkpoint every layout loads slice by slice
        pool = RankPool(4, timeout_s=7200, threads=1)
        try:
            results = pool.run(worker, args, tmp)[0]
        finally:
            pool.close()
    report(results, args, pathlib.Path(args.out))


if __name__ == "__main__":
    main()
