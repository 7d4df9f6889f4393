"""Benchmark (not a test): sequence parallelism on 2 gloo ranks, long sequences.

    python benchmarks/bench_sequence.py [--seqs 1024 2048 4096] [--batch 1] [--steps 2] [--png docs/sequence_parallel.png]
        [--only CONTESTANT ...] [--set intermediate_size=256 ...] [--no-tp4] [--sp4-seqs 2048 4096 8192 | --no-sp4]

Trains the Llama bench model of ``bench_llama_tp.py`` (4 blocks, hidden 512; positions raised to
the longest sequence) with AdamW on one batch of random tokens, for each sequence length, as:

* ``unsharded``: one process, one thread (the other rank waits);
* ``TP=2``: ``ShardConfig(tensor_parallel_size=2)`` (activations outside the TP regions replicated);
* ``TP=2 + split_gather``: ``enable_sequence_parallelism=True`` (Megatron-LM sequence parallelism);
* ``TP=2 + split_gather + overlap``: the same with ``enable_sequence_overlap=True``;
* ``SP=2 all_to_all (TP=1)``: DeepSpeed-Ulysses over 2 ranks, each holding the whole model;
* ``SP=2 ring_attn (TP=1)``: context parallelism over 2 ranks (zigzag; key/value blocks passed around the ring);
* ``SP=2 all_gather_kv (TP=1)``: the same split, each attention all-gathering every rank's keys and values.

Per contestant and length: step time (median; a step ends when the slowest rank does) and the
activation memory per rank: the growth of the process's resident memory from before the forward
to its end (what autograd keeps for the backward, with the logits; and the part of it the
transformer blocks add, from the first block's input to the last block's output), measured with glibc's mmap
threshold lowered to 64 kB so that large tensors are returned to the system when freed and the
resident size follows the live tensors; also the peak over the whole step (``VmHWM``, reset
before each step) above the resident size before it. The first loss of every contestant must
equal the unsharded one (relative 1e-5) or the run stops. Then, on 4 ranks, ``TP=4`` and
``TP=4 + split_gather`` for their activation memory only (4 processes on 2 cores: no step times;
``--no-tp4`` skips them). Then, on 4 ranks at ``--sp4-seqs`` (2048 to 8192 tokens), context parallelism
over 4 ranks, ``ring_attn`` against ``all_gather_kv`` (and the unsharded model on rank 0), with
step times (4 processes on 2 cores: each rank's share of the compute runs at about half speed),
and the **attention memory per rank**: the resident memory the model's attention function (the
registry's, after the projections and rotary embedding) leaves behind, summed over the layers
(what it keeps for the backward: the gathered or local keys and values, the outputs, the
log-sum-exp). ``--no-sp4`` skips them. Writes ``bench-results/sequence.json``
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
    (
        "SP=2 all_gather_kv (TP=1)",
        {
            "tensor_parallel_size": 1,
            "sequence_parallel_size": 2,
            "enable_sequence_parallelism": True,
            "sequence_parallelism_mode": "all_gather_kv",
        },
    ),
]


#: Memory only (4 ranks on this 2-core machine: their step times say nothing): Megatron-LM's count
#: of a block's activations puts split_gather at 34/t : (10 + 24/t), 0.53x of TP alone at t = 4.
CONTESTANTS_TP4 = [
    ("TP=4", {"tensor_parallel_size": 4}),
    ("TP=4 + split_gather", {"tensor_parallel_size": 4, "enable_sequence_parallelism": True}),
]


#: Context parallelism over 4 ranks at long sequences: the ring against the all-gather variant.
CONTESTANTS_SP4 = [("unsharded", None)] + [
    (
        f"SP=4 {mode} (TP=1)",
        {
            "tensor_parallel_size": 1,
            "sequence_parallel_size": 4,
            "enable_sequence_parallelism": True,
            "sequence_parallelism_mode": mode,
        },
    )
    for mode in ("ring_attn", "all_gather_kv")
]


class AttentionMemory:
    """The resident memory each call of the model's attention function (the registry's) leaves
    behind, summed over the calls since :meth:`reset`: what attention keeps for the backward. A
    call made inside a measured call (a shardcore attention wrapping an implementation measured
    earlier in this process) is counted once, by the outermost."""

    def __init__(self) -> None:
        self.kb, self.depth = 0, 0

    def reset(self) -> None:
        self.kb = 0

    def watch(self, model) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        name = model.config._attn_implementation
        base = ALL_ATTENTION_FUNCTIONS[name]
        if getattr(base, "_bench_measured", False):
            return

        def measured(*args, **kwargs):
            if self.depth:  # inside an outer measured call: it counts this one
                return base(*args, **kwargs)
            self.depth += 1
            try:
                before = rss_kb("VmRSS")
                out = base(*args, **kwargs)
                self.kb += rss_kb("VmRSS") - before
            finally:
                self.depth -= 1
            return out

        measured._bench_measured = True
        ALL_ATTENTION_FUNCTIONS.register(name, measured)


def build(max_positions: int, overrides: dict | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**CONFIG, **(overrides or {}), "max_position_embeddings": max_positions})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def _train(args, checkpoint: str, layout: dict | None, batch: dict, longest: int, attention) -> dict:
    """Warm-up and measured steps of one contestant on this rank: the first loss and the lists of
    measured step times and memory figures."""
    import gc

    import shardcore

    with shardcore.init_empty():
        model = build(longest, args.set)
    if layout is not None:
        model = shardcore.optimize(model, shardcore.ShardConfig(**layout))
    shardcore.load_checkpoint(model, checkpoint)
    attention.watch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    layers, marks = model.model.layers, {}
    layers[0].register_forward_pre_hook(lambda m, a: marks.__setitem__("in", rss_kb("VmRSS")))
    layers[-1].register_forward_hook(lambda m, a, o: marks.__setitem__("out", rss_kb("VmRSS")))
    got = {"loss": 0.0, "step_s": [], "activation_mb": [], "blocks_mb": [], "step_peak_mb": [], "attention_mb": []}
    for step in range(args.warmup + args.steps):
        opt.zero_grad(set_to_none=True)
        gc.collect()
        if layout is not None:
            dist.barrier()
        pathlib.Path("/proc/self/clear_refs").write_text("5")
        attention.reset()
        before = rss_kb("VmRSS")
        start = time.perf_counter()
        loss = model(**batch).loss
        held = rss_kb("VmRSS") - before
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            got["step_s"].append(elapsed)
            got["activation_mb"].append(held / 1024)
            got["blocks_mb"].append((marks["out"] - marks["in"]) / 1024)
            got["step_peak_mb"].append((rss_kb("VmHWM") - before) / 1024)
            got["attention_mb"].append(attention.kb / 1024)
        if step == 0:
            got["loss"] = loss.item()
    return got


def worker(args, checkpoint: str, contestants: list, seqs: list[int]) -> list[dict]:
    import gc

    rank = dist.get_rank()
    torch.set_num_threads(1)
    results, attention = [], AttentionMemory()
    longest = max([*args.seqs, *([] if args.no_sp4 else args.sp4_seqs)])
    for seq in seqs:
        g = torch.Generator().manual_seed(seq)
        ids = torch.randint(0, {**CONFIG, **args.set}["vocab_size"], (args.batch, seq), generator=g)
        batch = {"input_ids": ids, "labels": ids}
        for name, layout in contestants:
            gc.collect()
            dist.barrier()
            got = {"loss": 0.0}
            if layout is not None or rank == 0:  # the unsharded model runs on rank 0
                got = _train(args, checkpoint, layout, batch, longest, attention)
            row = {"name": name, "seq": seq, "rank": rank, "loss": got["loss"]}
            for key in ("step_s", "activation_mb", "blocks_mb", "step_peak_mb", "attention_mb"):
                row[key] = statistics.median(got[key]) if got.get(key) else 0.0
            if layout is not None:
                row["step_s"] = slowest(row["step_s"])
            results.append(row)
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
    table, everything = [], results
    results = [r for r in results if r.get("pool") != "sp4"]  # (all of them are written below)
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
    table += _report_sp4(everything, args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"config": {**CONFIG, **args.set}, "batch": args.batch, "table": table, "results": everything}, indent=2
        )
    )
    print(f"\nwritten: {out}")
    return table


def _report_sp4(results: list[dict], args) -> list[dict]:
    rows_sp4 = [r for r in results if r["name"].startswith("SP=4")]
    if not rows_sp4:
        return []
    print("\n4 ranks, context parallelism (4 processes on 2 cores: step times at about half speed per rank)\n")
    print(
        "| seq | contestant | step s | vs unsharded | activation MB/rank (max) | attention MB/rank (max) | "
        "attention vs all_gather_kv |"
    )
    print("|---|---|---|---|---|---|---|")
    table = []
    for seq in sorted({r["seq"] for r in rows_sp4}):
        rows = [r for r in results if r["seq"] == seq and r.get("pool") == "sp4"]
        ref = next(r for r in rows if r["name"] == "unsharded" and r["rank"] == 0)
        gathered = max(r["attention_mb"] for r in rows if r["name"] == "SP=4 all_gather_kv (TP=1)")
        for name, _ in CONTESTANTS_SP4:
            mine = [r for r in rows if r["name"] == name and (name != "unsharded" or r["rank"] == 0)]
            _same_first_loss(mine, ref, name, seq)
            entry = {
                "seq": seq,
                "name": name,
                "ranks": 4,
                "step_s": mine[0]["step_s"],
                "vs_unsharded": mine[0]["step_s"] / ref["step_s"],
                "activation_mb": max(r["activation_mb"] for r in mine),
                "attention_mb": max(r["attention_mb"] for r in mine),
            }
            entry["attention_vs_all_gather_kv"] = _ratio(entry["attention_mb"], gathered)
            table.append(entry)
            print(
                f"| {seq} | {name} | {entry['step_s']:.3f} | {entry['vs_unsharded']:.2f}x | "
                f"{entry['activation_mb']:.0f} | {entry['attention_mb']:.0f} | "
                f"{entry['attention_vs_all_gather_kv']:.2f}x |"
            )
    return table


def draw(table: list[dict], png: pathlib.Path) -> None:
    """Activation memory per rank and step time against the sequence length, one line per mode
    (2 ranks); with the 4-rank rows, a third panel: attention memory per rank, ring against gather."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sp4 = [e for e in table if e.get("ranks") == 4]
    fig, axes = plt.subplots(1, 3 if sp4 else 2, figsize=(16 if sp4 else 11, 4))
    mem, step = axes[0], axes[1]
    for name, _ in CONTESTANTS:
        rows = [e for e in table if e["name"] == name and "ranks" not in e]
        mem.plot([e["seq"] for e in rows], [e["activation_mb"] for e in rows], marker="o", label=name)
        step.plot([e["seq"] for e in rows], [e["step_s"] for e in rows], marker="o", label=name)
    two = [e for e in table if "ranks" not in e]
    panels = [(mem, "activation memory per rank (MB)", two), (step, "training step (s)", two)]
    if sp4:
        attn = axes[2]
        for name, _ in CONTESTANTS_SP4:
            rows = [e for e in sp4 if e["name"] == name]
            attn.plot([e["seq"] for e in rows], [e["attention_mb"] for e in rows], marker="o", label=name)
        attn.set_yscale("log")
        attn.legend()
        panels.append((attn, "attention memory per rank (MB), 4 ranks", sp4))
    for ax, label, rows in panels:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({e["seq"] for e in rows if e["name"] == "unsharded"}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    mem.legend()
    fig.suptitle("Llama bench model (4 blocks, hidden 512), batch 1, 2 gloo ranks (and 4, right)", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"written: {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seqs", type=int, nargs="*", default=[1024, 2048, 4096], help="2-rank lengths (none: the 4-rank rows only)"
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default="bench-results/sequence.json")
    parser.add_argument("--png", default="docs/sequence_parallel.png")
    parser.add_argument("--no-tp4", action="store_true", help="skip the 4-rank memory rows")
    parser.add_argument(
        "--sp4-seqs",
        type=int,
        nargs="+",
        default=[2048, 4096, 8192],
        help="lengths of the 4-rank ring_attn vs all_gather_kv rows",
    )
    parser.add_argument("--no-sp4", action="store_true", help="skip the 4-rank context-parallel rows")
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
        build(max([*args.seqs, *([] if args.no_sp4 else args.sp4_seqs)]), args.set).save_pretrained(tmp)
        if args.only:
            unknown = set(args.only) - {name for name, _ in CONTESTANTS}
            if unknown:
                parser.error(f"--only: no contestant {sorted(unknown)}; they are {[n for n, _ in CONTESTANTS]}")
            CONTESTANTS[:] = [(n, c) for n, c in CONTESTANTS if n in {"unsharded", "TP=2", *args.only}]
        results = []
        if args.seqs:
            pool = RankPool(2, timeout_s=7200, threads=1)
            try:
                results = pool.run(worker, args, tmp, CONTESTANTS, args.seqs)[0]
            finally:
                pool.close()
        if args.seqs and not args.no_tp4:
            pool = RankPool(4, timeout_s=7200, threads=1)
            try:
                results += pool.run(worker, args, tmp, CONTESTANTS_TP4, args.seqs)[0]
            finally:
                pool.close()
        if not args.no_sp4:
            pool = RankPool(4, timeout_s=7200, threads=1)
            try:
                results += [
                    {**r, "pool": "sp4"} for r in pool.run(worker, args, tmp, CONTESTANTS_SP4, args.sp4_seqs)[0]
                ]
            finally:
                pool.close()
    table = report(results, args, pathlib.Path(args.out))
    if args.png:
        draw(table, pathlib.Path(args.png))


if __name__ == "__main__":
    main()
