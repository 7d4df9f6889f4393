"""Benchmark (not a test): pipeline parallelism, every schedule, on 2 gloo ranks.

    python benchmarks/bench_pipeline.py [--batch 8] [--seq 256] [--steps 3] [--warmup 1] [--png docs/pipeline_timeline.png]

Trains the Llama bench model of ``bench_llama_tp.py`` (4 blocks; built on meta, one checkpoint
loaded slice by slice) with AdamW on one global batch, as:

* ``unsharded``: one process, one thread (the other rank waits);
* ``TP=2``: ``ShardConfig(tensor_parallel_size=2)``, ``model(**batch).loss.backward()``;
* ``PP=2 <schedule>``: ``ShardConfig(pipeline_parallel_size=2, num_microbatches=M,
  pipeline_schedule=...)`` with :func:`shardcore.pipeline_step`, for every schedule of this torch
  (multi-stage ones with 2 stages per rank), M = 4; GPipe and 1F1B also with M = 2 and 8.

Per contestant: step time (median; a step ends when the slowest rank does), per-rank peak RSS
(``VmHWM``, reset before each contestant), parameter bytes per rank, and for the pipelines the
measured bubble fraction: ``1 - busy / (ranks x step)``, with ``busy`` the time the ranks spent
inside stage computations (forward, backward, weight-gradient chunks, timed around
``PipelineStage``'s chunk methods in the last measured step), against the theory
``(P - 1) / (M + P - 1)`` of one-stage schedules. The first loss of every contestant must equal
the unsharded one (relative 1e-5) or the run stops. With ``--png``, draws one step's per-rank
timeline of each schedule (matplotlib). Writes ``bench-results/pipeline.json``.
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


def _instrument(model, events: list, clock: list) -> None:
    """Record ``(kind, stage, microbatch, start, end)`` of each stage computation on this rank."""
    for pstage in model.shardcore.pipeline.stages:
        for method, kind in (
            ("forward_one_chunk", "F"),
            ("backward_one_chunk", "B"),
            ("backward_weight_one_chunk", "W"),
        ):
            original = getattr(pstage, method)

            def timed(chunk, *args, __original=original, __kind=kind, __stage=pstage.stage_index, **kwargs):
                start = time.perf_counter()
                try:
                    return __original(chunk, *args, **kwargs)
                finally:
                    events.append((__kind, __stage, chunk, start - clock[0], time.perf_counter() - clock[0]))

            setattr(pstage, method, timed)


def contestants(schedules: list[str]) -> list[tuple[str, dict | None, int]]:
    out: list[tuple[str, dict | None, int]] = [("unsharded", None, 0), ("TP=2", {"tensor_parallel_size": 2}, 0)]
    for name in schedules:
        for m in (2, 4, 8) if name in ("GPipe", "1F1B") else (4,):
            out.append(
                (
                    f"PP=2 {name} M={m}",
                    {"pipeline_parallel_size": 2, "num_microbatches": m, "pipeline_schedule": name},
                    m,
                )
            )
    return out


def worker(args, checkpoint: str) -> list[dict]:
    import gc

    import shardcore
    from shardcore.pipeline import schedule_names

    rank = dist.get_rank()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (args.batch, args.seq), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    results = []
    for name, layout, micro in contestants(schedule_names()):
        gc.collect()
        dist.barrier()
        pathlib.Path("/proc/self/clear_refs").write_text("5")
        before = rss_kb("VmRSS")
        active = layout is not None or rank == 0
        times, first, held, events = [], 0.0, 0, []
        if active:
            with shardcore.init_empty():
                model = build()
            if layout is not None:
                model = shardcore.optimize(model, shardcore.ShardConfig(**layout))
            shardcore.load_checkpoint(model, checkpoint)
            held = sum(p.numel() * p.element_size() for p in model.parameters())
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            clock = [0.0]
            pipelined = layout is not None and "pipeline_parallel_size" in layout
            for step in range(args.warmup + args.steps):
                if pipelined and step == 1:  # the first step builds the stages anew (meta -> loaded): time these
                    _instrument(model, events, clock)
                if layout is not None:
                    dist.barrier()
                events.clear()
                clock[0] = start = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss = shardcore.pipeline_step(model, batch)
                opt.step()
                if step >= args.warmup:
                    times.append(time.perf_counter() - start)
                if step == 0:
                    first = loss.item()
            del model, opt
        step_s = (
            slowest(statistics.median(times)) if layout is not None else (statistics.median(times) if times else 0.0)
        )
        row = {
            "name": name,
            "rank": rank,
            "micro": micro,
            "loss": first,
            "step_s": step_s,
            "peak_rss_mb": rss_kb("VmHWM") / 1024,
            "rss_increase_mb": (rss_kb("VmHWM") - before) / 1024,
            "param_mb": held / 2**20,
            "events": list(events),
        }
        results.append(row)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    return [r for rows in gathered for r in rows] if rank == 0 else []


def bubble(rows: list[dict]) -> float | None:
    """``1 - busy / (ranks x wall)`` of the last measured step, from the recorded stage computations."""
    if not rows[0]["events"]:
        return None
    wall = max(e[4] for r in rows for e in r["events"])
    busy = sum(e[4] - e[3] for r in rows for e in r["events"])
    return 1 - busy / (len(rows) * wall)


def report(results: list[dict], args, out: pathlib.Path) -> None:
    ref = next(r for r in results if r["name"] == "unsharded" and r["rank"] == 0)
    names = list(dict.fromkeys(r["name"] for r in results))
    print(f"\nLlama bench model {CONFIG}, AdamW, global batch {args.batch} x seq {args.seq}, 2 gloo ranks x 1 thread\n")
    print(
        "| contestant | step s | vs unsharded | vs TP=2 | peak RSS MB/rank (max) | params MB/rank (max) | bubble measured | bubble theory (P-1)/(M+P-1) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    tp2 = next(r for r in results if r["name"] == "TP=2")["step_s"]
    table = []
    for name in names:
        rows = [r for r in results if r["name"] == name and (name != "unsharded" or r["rank"] == 0)]
        for r in rows:
            if abs(r["loss"] - ref["loss"]) > 1e-5 * abs(ref["loss"]):
                raise AssertionError(f"{name}: first loss {r['loss']:.7f} != unsharded {ref['loss']:.7f}")
        step = rows[0]["step_s"]
        measured = bubble(rows) if name.startswith("PP") else None
        micro = rows[0]["micro"]
        theory = (2 - 1) / (micro + 2 - 1) if micro else None
        entry = {
            "name": name,
            "step_s": step,
            "vs_unsharded": step / ref["step_s"],
            "vs_tp2": step / tp2,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rows),
            "param_mb": max(r["param_mb"] for r in rows),
            "bubble": measured,
            "theory": theory,
        }
        table.append(entry)
        print(
            f"| {name} | {step:.3f} | {entry['vs_unsharded']:.2f}x | {entry['vs_tp2']:.2f}x | "
            f"{entry['peak_rss_mb']:.0f} | {entry['param_mb']:.1f} | "
            f"{'' if measured is None else f'{measured:.2f}'} | {'' if theory is None else f'{theory:.2f}'} |"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"config": CONFIG, "batch": args.batch, "seq": args.seq, "table": table, "results": results}, indent=2
        )
    )
    print(f"\nwritten: {out}")
    if args.png:
        draw(results, pathlib.Path(args.png))


def draw(results: list[dict], png: pathlib.Path) -> None:
    """One step's per-rank timeline for each schedule at M=4: a row per rank, a block per stage
    computation (F forward, B backward or input-gradient, W weight-gradient), idle time blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in dict.fromkeys(r["name"] for r in results) if n.startswith("PP") and n.endswith("M=4")]
    fig, axes = plt.subplots(len(names), 1, figsize=(12, 1.3 * len(names) + 0.6), squeeze=False)
    colors = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
    for ax, name in zip(axes[:, 0], names, strict=True):
        rows = sorted((r for r in results if r["name"] == name), key=lambda r: r["rank"])
        wall = max(e[4] for r in rows for e in r["events"])
        for r in rows:
            for kind, stage, chunk, start, end in r["events"]:
                ax.barh(r["rank"], end - start, left=start, color=colors[kind], edgecolor="white", height=0.8)
                if end - start > wall * 0.025:
                    ax.text(
                        (start + end) / 2,
                        r["rank"],
                        f"{kind}{chunk}"
                        + (
                            f"/s{stage}"
                            if "Interleaved" in name or "ZB" in name or "Dual" in name or "Looped" in name
                            else ""
                        ),
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="white",
                    )
        ax.set_yticks([r["rank"] for r in rows], [f"rank {r['rank']}" for r in rows])
        ax.invert_yaxis()
        ax.set_xlim(0, wall)
        measured = bubble(rows)
        ax.set_title(
            f"{name.removeprefix('PP=2 ')}: one step, {wall:.2f} s, bubble {measured:.0%}", fontsize=9, loc="left"
        )
    axes[-1, 0].set_xlabel(
        "seconds into the step (F forward, B backward / input gradient, W weight gradient; blank: idle)"
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"written: {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="at least 1")
    parser.add_argument("--out", default="bench-results/pipeline.json")
    parser.add_argument("--png", default="docs/pipeline_timeline.png")
    args = parser.parse_args()
    from shardcore.testing import RankPool

    with tempfile.TemporaryDirectory() as tmp:
        build().save_pretrained(tmp)
        pool = RankPool(2, timeout_s=7200, threads=1)
        try:
            results = pool.run(worker, args, tmp)[0]
        finally:
            pool.close()
    report(results, args, pathlib.Path(args.out))


if __name__ == "__main__":
    main()
