"""Benchmark (not a test): data parallelism on the mesh, 4 gloo ranks, the Llama bench model.

    python benchmarks/bench_data_parallel.py [--batch 8] [--seq 256] [--steps 5] [--warmup 2]

Starts 4 gloo ranks (1 thread each; this machine has 2 cores, so the ranks share them) and trains
the Llama bench model of ``bench_llama_tp.py`` with AdamW on one global batch, laid out as:

* ``TP=4``: tensor parallel over the 4 ranks, every rank runs the whole batch;
* ``FSDPxTP 2x2``: ``ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="fsdp")``;
* ``DDPxTP 2x2``: the same with ``data_parallel="ddp"``;
* ``FSDP=4``, ``DDP=4``, ``ZeRO-2=4``: ``tensor_parallel_size=1, data_parallel_size=4`` and that engine;
* ``HSDP 2x2``: ``data_parallel="hsdp", data_parallel_shard_size=2`` (split over 2, replicated over 2);
* ``unsharded``: the whole model, whole batch, in one process with one thread.

Each layout runs in fresh processes: it builds the model on the meta device
(:func:`shardcore.init_empty`), shards it and loads one checkpoint (written once by this script),
so no rank ever holds the whole model, then runs ``--warmup`` + ``--steps`` optimizer steps (each
data-parallel rank on its part of the batch). Measured per rank: the step time (median; a step
ends when the slowest rank does), the peak RSS of the process (``VmHWM``) and its increase over
the RSS before the model was built (imports and the process group already there), and the bytes
of parameters + AdamW state it holds, beside what ``explain``'s cost model predicts for the layout
(:func:`shardcore.cost.model.memory_per_rank`, on paper). The first step's loss
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
from bench_common import rss_kb, slowest
from bench_llama_tp import CONFIG, build

LAYOUTS = {
    "TP=4": {"tensor_parallel_size": 4},
    "FSDPxTP 2x2": {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"},
    "DDPxTP 2x2": {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "ddp"},
    "FSDP=4": {"tensor_parallel_size": 1, "data_parallel_size": 4, "data_parallel": "fsdp"},
    "DDP=4": {"tensor_parallel_size": 1, "data_parallel_size": 4, "data_parallel": "ddp"},
    "ZeRO-2=4": {"tensor_parallel_size": 1, "data_parallel_size": 4, "data_parallel": "zero2"},
    "HSDP 2x2": {"tensor_parallel_size": 1, "data_parallel": "hsdp", "data_parallel_shard_size": 2},
    "unsharded": None,
}


def predicted(name: str, args) -> dict | None:
    """``explain``'s cost model for the layout (on paper, a meta model): bytes per rank."""
    import shardcore
    from shardcore.cost.model import memory_per_rank
    from shardcore.cost.search import workload_facts

    fields = LAYOUTS[name]
    if fields is None:
        return None
    tp = fields["tensor_parallel_size"]
    dp = 4 // tp
    layout = {"dp": dp, "pp": 1, "sp": 1, "tp": tp, "ep": 1, "mode": None, "microbatches": 1}
    layout.update(data_parallel=fields.get("data_parallel"), shard=fields.get("data_parallel_shard_size", dp))
    with shardcore.init_empty():
        model = build()
    facts = workload_facts(model, layout, seq=args.seq, batch=args.batch)
    return memory_per_rank(facts, layout, "adamw")


def worker(args, checkpoint: str, name: str) -> dict:
    """One layout in fresh processes: build on meta, shard, load, train; this rank's figures."""
    import shardcore
    from shardcore.testing import dp_part, state_bytes

    layout = LAYOUTS[name]
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (args.batch, args.seq), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    import importlib

    for lazy in (  # what the layouts import on first use, imported before "before"
        "shard_llama.policy",
        "torch.distributed.fsdp",
        "torch.distributed.tensor",
        "torch.distributed._composable.replicate",
        "transformers.models.llama.modeling_llama",
    ):
        importlib.import_module(lazy)

    before = rss_kb("VmRSS")  # torch, transformers' Llama and shardcore imported, the process group up
    with shardcore.init_empty():
        model = build()
    if layout is not None:
        model = shardcore.optimize(model, shardcore.ShardConfig(**layout))
    shardcore.load_checkpoint(model, checkpoint)
    mine, dp = batch, 1
    if layout is not None and layout.get("data_parallel"):
        info = model.shardcore.layout
        mine, dp = dp_part(batch, info.coordinates(dist.get_rank())["dp"], info.dp), info.dp
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, first = [], None
    for step in range(args.warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(**mine).loss
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        if step == 0:
            first = loss.detach().clone()
    dist.all_reduce(first)  # each TP group repeats its data-parallel rank's loss: the mean over all ranks
    peak = rss_kb("VmHWM")
    return {
        "layout": name,
        "rank": dist.get_rank(),
        "dp": dp,
        "loss": first.item() / dist.get_world_size(),
        "step_s": slowest(statistics.median(times)),
        "peak_rss_mb": peak / 1024,
        "rss_increase_mb": (peak - before) / 1024,
        "state_mb": state_bytes(model, opt) / 2**20,
    }


def report(results: list[dict], args, out: pathlib.Path) -> None:
    ref = next(r for r in results if r["layout"] == "unsharded" and r["rank"] == 0)
    for r in results:
        if r["layout"] != "unsharded" and abs(r["loss"] - ref["loss"]) > 1e-4 * abs(ref["loss"]):
            raise AssertionError(f"{r['layout']}: first loss {r['loss']:.6f} != unsharded {ref['loss']:.6f}")
    tp4 = next(r for r in results if r["layout"] == "TP=4")["step_s"]
    print(f"\nLlama bench model {CONFIG}, AdamW, global batch {args.batch} x seq {args.seq}")
    print("4 gloo ranks x 1 thread on this machine's 2 cores; unsharded: one process, one thread\n")
    print(
        "| layout | step s | vs TP=4 | per-rank peak RSS MB (max) | its increase MB | params+AdamW MB/rank "
        "| explain: params+AdamW MB | explain: + gradients, gathered, activations MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    predictions = {}
    for name in LAYOUTS:
        rows = [r for r in results if r["layout"] == name and (name != "unsharded" or r["rank"] == 0)]
        step = rows[0]["step_s"]
        mem = predictions[name] = predicted(name, args)
        held = "" if mem is None else f"{(mem['parameters'] + mem['optimizer']) / 2**20:.1f}"
        rest = "" if mem is None else f"{(mem['gradients'] + mem['gathered'] + mem['activations']) / 2**20:.1f}"
        print(
            f"| {name} | {step:.3f} | {step / tp4:.2f}x | {max(r['peak_rss_mb'] for r in rows):.0f} | "
            f"{max(r['rss_increase_mb'] for r in rows):.0f} | {max(r['state_mb'] for r in rows):.1f} | {held} | {rest} |"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"config": CONFIG, "batch": args.batch, "seq": args.seq, "results": results, "explain": predictions}
    out.write_text(json.dumps(record, indent=2))
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

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        build().save_pretrained(tmp)  # one checkpoint every layout loads slice by slice
        for name, layout in LAYOUTS.items():  # fresh processes per layout: peaks are the layout's own
            pool = RankPool(4 if layout is not None else 1, timeout_s=7200, threads=1)
            try:
                results += pool.run(worker, args, tmp, name)
            finally:
                pool.close()
            print(f"{name}: done", flush=True)
    report(results, args, pathlib.Path(args.out))


if __name__ == "__main__":
    main()
