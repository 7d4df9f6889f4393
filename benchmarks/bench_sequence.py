"""Benchmark (not a test): sequence parallelism on 2 gloo ranks, long sequences.

    python benchmarks/bench_sequence.py [--seqs 1024 2048 4096] [--batch 1] [--steps 2] [--png docs/sequence_parallel.png]
        [--only CONTESTANT ...] [--set intermediate_size=256 ...] [--no-tp4]

Trains the Llama bench model of ``bench_llama_tp.py`` (4 blocks, hidden 512; positions raised to
the longest sequence) with AdamW on one batch of random tokens, for each sequence length, as:

* ``unsharded``: one process, one thread (the other rank waits);
* ``TP=2``: ``ShardConfig(tensor_parallel_size=2)`` (activations outside the TP regions replicated);
* ``TP=2 + split_gather``: ``enable_sequence_parallelism=True`` (Megatron-LM sequence parallelism);
* ``TP=2 + split_gather + overlap``: the same with ``enable_sequence_overlap=True``;
* ``SP=2 all_to_all (TP=1)``: DeepSpeed-Ulysses over 2 ranks, each holding the whole model;
* ``SP=2 ring_attn (TP=1)``: context parallelism over 2 ranks (zigzag; key/value blocks passed around the ring).

Per contestant and length: step time (median; a step ends when the slowest rank does) and the
activation memory per rank: the growth of the process's resident memory from before the forward
to its end (what autograd keeps for the backward, with the logits; and the part of it the
transformer blocks add, from the first block's input to the last block's output), measured with glibc's mmap
threshold lowered to 64 kB so that large tensors are returned to the system when freed and the
resident size follows the live tensors; also the peak over the whole step (``VmHWM``, reset
before each step) above the resident size before it. The first loss of every contestant must
equal the unsharded one (relative 1e-5) or the run stops. Then, on 4 ranks, ``TP=4`` and
``TP=4 + split_gather`` for their activation memory only (4 processes on 2 cores: no step times;
``--no-tp4`` skips them). Writes ``bench-results/sequence.json``
and, with ``--png``, a plot of both against the sequence length.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

if "--timing" not in sys.argv:  # before torch allocates: freed tensors leave the RSS
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_common import rss_kb, slowest
from bench_llama_tp import CONFIG

CONTESTANTS = [
    ("unsharded", None),
    ("TP=2", {"tensor_parallel_size": 2}),
    ("TP=2 + split_gather", {"tensor_parallel_size": 2, "enable_sequence_parallelism": True}),
    (
        "TP=2 + split_gather + overlap",
        {"tensor_parallel_size": 2, "enable_sequence_parallelism": True, "enable_sequence_overlap": True},
    ),
    (
        "SP=2 all_to_all (TP=1)",
        {
            "tensor_parallel_size": 1,
            "sequence_parallel_size": 2,
            "enable_sequence_parallelism": True,
            "sequence_parallelism_mode": "all_to_all",
        },
    ),
    (
        "SP=2 ring_attn (TP=1)",
        {
            "tensor_parallel_size": 1,
            "sequence_parallel_size": 2,
            "enable_sequence_parallelism": True,
            "sequence_parallelism_mode": "ring_attn",
        },
    ),
]


#: Memory only (4 ranks on this 2-core machine: their step times say nothing): Megatron-LM's count
#: of a block's activations puts split_gather at 34/t : (10 + 24/t), 0.53x of TP alone at t = 4.
CONTESTANTS_TP4 = [
    ("TP=4", {"tensor_parallel_size": 4}),
    ("TP=4 + split_gather", {"tensor_parallel_size": 4, "enable_sequence_parallelism": True}),
]


def build(max_positions: int, overrides: dict | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**CONFIG, **(overrides or {}), "max_position_embeddings": max_positions})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def worker(args, checkpoint: str, contestants: list) -> list[dict]:
    import gc

    import shardcore

    rank = dist.get_rank()
    torch.set_num_threads(1)
    results = []
    for seq in args.seqs:
        g = torch.Generator().manual_seed(seq)
        ids = torch.randint(0, {**CONFIG, **args.set}["vocab_size"], (args.batch, seq), generator=g)
        batch = {"input_ids": ids, "labels": ids}
        for name, layout in contestants:
            gc.collect()
            dist.barrier()
            active = layout is not None or rank == 0
            times, first, activation, peak, blocks = [], 0.0, [], [], []
            if active:
                with shardcore.init_empty():
                    model = build(max(args.seqs), args.set)
                if layout is not None:
                    model = shardcore.optimize(model, shardcore.ShardConfig(**layout))
                shardcore.load_checkpoint(model, checkpoint)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
                layers, marks = model.model.layers, {}
                layers[0].register_forward_pre_hook(lambda m, a, marks=marks: marks.__setitem__("in", rss_kb("VmRSS")))
                layers[-1].register_forward_hook(lambda m, a, o, marks=marks: marks.__setitem__("out", rss_kb("VmRSS")))
                for step in range(args.warmup + args.steps):
                    opt.zero_grad(set_to_none=True)
                    gc.collect()
                    if layout is not None:
                        dist.barrier()
                    pathlib.Path("/proc/self/clear_refs").write_text("5")
                    before = rss_kb("VmRSS")
                    start = time.perf_counter()
                    loss = model(**batch).loss
                    held = rss_kb("VmRSS") - before
                    loss.backward()
                    opt.step()
                    elapsed = time.perf_counter() - start
                    if step >= args.warmup:
                        times.append(elapsed)
                        activation.append(held / 1024)
                        blocks.append((marks["out"] - marks["in"]) / 1024)
                        peak.append((rss_kb("VmHWM") - before) / 1024)
                    if step == 0:
                        first = loss.item()
                    del loss
                del model, opt
            step_s = statistics.median(times) if times else 0.0
            if layout is not None:
                step_s = slowest(step_s)
            results.append(
                {
                    "name": name,
                    "seq": seq,
                    "rank": rank,
                    "loss": first,
                    "step_s": step_s,
                    "activation_mb": statistics.median(activation) if activation else 0.0,
                    "blocks_mb": statistics.median(blocks) if blocks else 0.0,
                    "step_peak_mb": statistics.median(peak) if peak else 0.0,
                }
            )
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    return [r for rows in gathered for r in rows] if rank == 0 else []


def _same_first_loss(mine: list[dict], ref: dict, name: str, seq: int) -> None:
    for r in mine:
        if abs(r["loss"] - ref["loss"]) > 1e-5 * abs(ref["loss"]):
            raise AssertionError(f"{name} at {seq}: first loss {r['loss']:.7f} != unsharded {ref['loss']:.7f}")


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")  # --timing: the resident size does not follow the tensors


def report(results: list[dict], args, out: pathlib.Path) -> list[dict]:
    print(f"\nLlama bench model { ({**CONFIG, **args.set}) }, AdamW, batch {args.batch}, 2 gloo ranks x 1 thread\n")
    print(
        "| seq | contestant | step s | vs unsharded | vs TP=2 | activation MB/rank (max) | vs TP=2 | "
        "of it in the blocks MB | vs TP=2 | step peak MB/rank (max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    table = []
    for seq in args.seqs:
        rows = [r for r in results if r["seq"] == seq]
        ref = next(r for r in rows if r["name"] == "unsharded" and r["rank"] == 0)
        tp = [r for r in rows if r["name"] == "TP=2"]
        tp_step, tp_act = tp[0]["step_s"], max(r["activation_mb"] for r in tp)
        tp_blocks = max(r["blocks_mb"] for r in tp)
        for name, _ in CONTESTANTS:
            mine = [r for r in rows if r["name"] == name and (name != "unsharded" or r["rank"] == 0)]
            _same_first_loss(mine, ref, name, seq)
            entry = {
                "seq": seq,
                "name": name,
                "step_s": mine[0]["step_s"],
                "vs_unsharded": mine[0]["step_s"] / ref["step_s"],
                "vs_tp2": mine[0]["step_s"] / tp_step,
                "activation_mb": max(r["activation_mb"] for r in mine),
                "step_peak_mb": max(r["step_peak_mb"] for r in mine),
                "blocks_mb": max(r["blocks_mb"] for r in mine),
            }
            entry["activation_vs_tp2"] = _ratio(entry["activation_mb"], tp_act)
            entry["blocks_vs_tp2"] = _ratio(entry["blocks_mb"], tp_blocks)
            table.append(entry)
            print(
                f"| {seq} | {name} | {entry['step_s']:.3f} | {entry['vs_unsharded']:.2f}x | {entry['vs_tp2']:.2f}x | "
                f"{entry['activation_mb']:.0f} | {entry['activation_vs_tp2']:.2f}x | {entry['blocks_mb']:.0f} | "
                f"{entry['blocks_vs_tp2']:.2f}x | {entry['step_peak_mb']:.0f} |"
            )
    if any(r["name"] == "TP=4" for r in results):
        print("\n4 ranks (memory only: 4 processes on 2 cores)\n")
        print("| seq | contestant | activation MB/rank (max) | vs TP=4 | of it in the blocks MB | vs TP=4 |")
        print("|---|---|---|---|---|---|")
        for seq in args.seqs:
            rows = [r for r in results if r["seq"] == seq]
            ref = next(r for r in rows if r["name"] == "unsharded" and r["rank"] == 0)
            tp = [r for r in rows if r["name"] == "TP=4"]
            tp_act, tp_blocks = max(r["activation_mb"] for r in tp), max(r["blocks_mb"] for r in tp)
            for name, _ in CONTESTANTS_TP4:
                mine = [r for r in rows if r["name"] == name]
                _same_first_loss(mine, ref, name, seq)
                entry = {
                    "seq": seq,
                    "name": name,
                    "activation_mb": max(r["activation_mb"] for r in mine),
                    "blocks_mb": max(r["blocks_mb"] for r in mine),
                }
                entry["activation_vs_tp4"] = _ratio(entry["activation_mb"], tp_act)
                entry["blocks_vs_tp4"] = _ratio(entry["blocks_mb"], tp_blocks)
                table.append(entry)
                print(
                    f"| {seq} | {name} | {entry['activation_mb']:.0f} | {entry['activation_vs_tp4']:.2f}x | "
                    f"{entry['blocks_mb']:.0f} | {entry['blocks_vs_tp4']:.2f}x |"
                )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"config": {**CONFIG, **args.set}, "batch": args.batch, "table": table, "results": results}, indent=2
        )
    )
    print(f"\nwritten: {out}")
    return table


def draw(table: list[dict], png: pathlib.Path) -> None:
    """Activation memory per rank and step time against the sequence length, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, step) = plt.subplots(1, 2, figsize=(11, 4))
    for name, _ in CONTESTANTS:
        rows = [e for e in table if e["name"] == name]
        seqs = [e["seq"] for e in rows]
        mem.plot(seqs, [e["activation_mb"] for e in rows], marker="o", label=name)
        step.plot(seqs, [e["step_s"] for e in rows], marker="o", label=name)
    for ax, label in ((mem, "activation memory per rank (MB)"), (step, "training step (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks([e["seq"] for e in table if e["name"] == "unsharded"])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    mem.legend()
    fig.suptitle("Llama bench model (4 blocks, hidden 512), batch 1, 2 gloo ranks", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"written: {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default="bench-results/sequence.json")
    parser.add_argument("--png", default="docs/sequence_parallel.png")
    parser.add_argument("--no-tp4", action="store_true", help="skip the 4-rank memory rows")
    parser.add_argument(
        "--timing",
        action="store_true",
        help="step times only: glibc's default mmap threshold (freed memory is reused, not returned and "
        "faulted in again), so the memory columns mean nothing",
    )
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="run these contestants (and the unsharded and TP=2 references) only"
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=INT",
        help="change the bench model's config, e.g. intermediate_size=256 (less compute per byte sent)",
    )
    args = parser.parse_args()
    args.set = {key: int(value) for key, value in (item.split("=", 1) for item in args.set)}
    from shardcore.testing import RankPool

    with tempfile.TemporaryDirectory() as tmp:
        build(max(args.seqs), args.set).save_pretrained(tmp)
        if args.only:
            unknown = set(args.only) - {name for name, _ in CONTESTANTS}
            if unknown:
                parser.error(f"--only: no contestant {sorted(unknown)}; they are {[n for n, _ in CONTESTANTS]}")
            CONTESTANTS[:] = [(n, c) for n, c in CONTESTANTS if n in {"unsharded", "TP=2", *args.only}]
        pool = RankPool(2, timeout_s=7200, threads=1)
        try:
            results = pool.run(worker, args, tmp, CONTESTANTS)[0]
        finally:
            pool.close()
        if not args.no_tp4:
            pool = RankPool(4, timeout_s=7200, threads=1)
            try:
                results += pool.run(worker, args, tmp, CONTESTANTS_TP4)[0]
            finally:
                pool.close()
    table = report(results, args, pathlib.Path(args.out))
    if args.png:
        draw(table, pathlib.Path(args.png))


if __name__ == "__main__":
    main()
