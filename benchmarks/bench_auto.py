"""Benchmark (not a test): the cost model against the clock, every valid layout of 4 gloo ranks (or ``--world``).

    python benchmarks/bench_auto.py [--models llama bert moe] [--seqs 128 512] [--batch 4] [--steps 3] [--warmup 1] [--world 4]

For each model (the Llama of ``bench_llama_tp.py``; a BERT masked-LM, hidden 512, 4 layers, 8
heads, vocabulary 8192, no dropout; the Mixtral of ``bench_moe.py``, 8 experts top-2) and sequence length:

1. ``shardcore.cost.search`` on the meta model with this machine's profile (``shardcore
   calibrate --world 2 4``, read from the cache or measured first) lists every layout of 4 ranks
   (``--world``) optimize accepts, with its predicted step time, and the one ``explain --auto`` would choose;
2. each of those layouts is trained for real: ``shardcore.optimize(model, config)`` in one pool of
   4 gloo ranks (``--world``) x 1 thread (the profile's per-rank figures are measured the same way), AdamW,
   the global batch of ``--batch`` x ``seq`` random tokens (each data-parallel rank its part;
   pipelines through ``shardcore.pipeline_step``); the step time is the median over ``--steps``
   after ``--warmup`` (a step ends when the slowest rank does), beside each rank's CPU seconds
   per step (its process time: every thread, gloo's included). The first loss (the mean over the
   data-parallel parts) must equal the unsharded model's on the same parts (relative 1e-4) or the
   run stops.

Reported per model and length: the measured rank of the chosen layout and its time over the
fastest's, and per layout the predicted and measured step time and their relative error (the
median absolute error over every layout at the end). Writes ``bench-results/auto.json``.

    python benchmarks/bench_auto.py --summarize benchmarks/results/auto.json [--png docs/auto_layout.png] [--profile FILE]

reads the repeated runs ``benchmarks/repeat.py --name auto`` merged and scores today's cost model
on them: per layout the median measured step time over the runs (min-max) and the CPU seconds
every rank spent per step (all its threads, gloo's included) over the machine's cores (what the
step would take were the cores never idle), predicted again from the profile the runs recorded
(the measurements do not depend on the cost model, so a change to it is scored without
measuring again); the chosen layout's rank by those medians; the median
absolute error; and the same error with each step scaled to the profile's machine speed (the reference block
timed as ``calibrate`` times it, every rank at once, before and after each model's layouts: a shared machine's
speed drifts between ``calibrate`` and the runs, and within them); a plot of predicted against measured, one point
per layout. ``--profile``: the
predictions from that profile (this machine calibrated again) instead. Writes
``benchmarks/results/auto_summary.json`` (beside the runs: ``NAME_summary.json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_common import slowest

WORLD = 4
BERT = {
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "vocab_size": 8192,
    "max_position_embeddings": 1024,
    "hidden_dropout_prob": 0.0,  # no dropout: every layout's loss comparable with the unsharded one
    "attention_probs_dropout_prob": 0.0,
}


def build(name: str):
    """The model ``name`` with its random weights (seeded), attention through SDPA."""
    import transformers
    from bench_llama_tp import CONFIG as LLAMA
    from bench_moe import CONFIG as MOE

    cls, cfg_cls, kwargs = {
        "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, LLAMA),
        "bert": (transformers.BertForMaskedLM, transformers.BertConfig, BERT),
        "moe": (transformers.MixtralForCausalLM, transformers.MixtralConfig, MOE),
    }[name]
    config = cfg_cls(**kwargs)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return cls(config)


def data(name: str, batch: int, seq: int) -> dict:
    vocab = build_config_vocab(name)
    ids = torch.randint(1, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def build_config_vocab(name: str) -> int:
    from bench_llama_tp import CONFIG as LLAMA
    from bench_moe import CONFIG as MOE

    return {"llama": LLAMA, "bert": BERT, "moe": MOE}[name]["vocab_size"]


def machine_speed() -> float:
    """The reference block's FLOP/s a rank gets with every rank at work, timed now as ``calibrate`` times it (its
    forward and backward at the reference shape, 3 rounds of 1 s, each until the last rank is done): the machine's
    speed beside the runs, against the profile's ``block_flops`` (a shared machine's speed drifts between
    ``calibrate`` and a benchmark; see :func:`summarize`)."""
    from shardcore.cost.measure import BLOCK, _in_rounds, _RankBlock, block_step_flops

    width, _, ffn, batch, seq = BLOCK
    block = _RankBlock(1)
    x = torch.randn(batch, seq, width, requires_grad=True)
    seconds = _in_rounds({0: lambda: block(x).sum().backward()}, torch.device("cpu"), 3, 1.0)[0]
    return block_step_flops(width, ffn, batch * seq, seq) / seconds


def worker(name: str, seq: int, batch: int, layouts: list[dict], warmup: int, steps: int) -> list[dict]:
    """On each of the 4 ranks: every layout in turn, its step time and first loss; the machine's speed
    (:func:`machine_speed`) before the first and after the last."""
    import shardcore
    from shardcore.cost.search import shard_config
    from shardcore.testing import dp_part

    torch.set_num_threads(1)
    speed = [machine_speed()]
    out = []
    for layout in layouts:
        model = shardcore.optimize(build(name), shard_config(layout))
        info = model.shardcore.layout
        part = data(name, batch, seq)
        if info.dp > 1:
            part = dp_part(part, info.coordinates(dist.get_rank())["dp"], info.dp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        times, phases, cpus, first = [], [], [], None
        for step in range(warmup + steps):
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            opt.zero_grad(set_to_none=True)
            if info.pp > 1:
                loss = shardcore.pipeline_step(model, part)
                forward = backward = time.perf_counter()
            else:
                loss = model(**part).loss
                forward = time.perf_counter()
                loss.backward()
                backward = time.perf_counter()
            opt.step()
            end, cpu = time.perf_counter(), time.process_time() - cpu
            if step >= warmup:
                times.append(end - start)
                cpus.append(cpu)
                phases.append((forward - start, backward - forward, end - backward))
            if step == 0:
                first = loss.detach().clone().reshape(1)
        dist.all_reduce(first)  # every rank of a data-parallel part holds its loss: the mean of the parts
        split = [statistics.median(p[i] for p in phases) for i in range(3)]  # this rank's forward, backward, optimizer
        cpu_s = [None] * dist.get_world_size()  # each rank's CPU seconds per step, every thread of it (gloo's included)
        dist.all_gather_object(cpu_s, statistics.median(cpus))
        out.append({"layout": layout, "step_s": slowest(statistics.median(times)), "loss": first.item() / dist.get_world_size(),
                    "rank0_phases_s": dict(zip(("forward", "backward", "optimizer"), split, strict=True)),
                    "cpu_s_per_rank": cpu_s})  # fmt: skip
        del model, opt
        gc.collect()
    speed.append(machine_speed())
    return {"layouts": out, "block_flops": speed}


def reference_loss(name: str, seq: int, batch: int, dp: int) -> float:
    """The unsharded model's loss: the mean over ``dp`` equal parts of the batch."""
    from shardcore.testing import dp_part

    model = build(name)
    with torch.no_grad():
        whole = data(name, batch, seq)
        return statistics.fmean(model(**dp_part(whole, i, dp)).loss.item() for i in range(dp))


def run(name: str, seq: int, args, profile: dict) -> dict:
    import shardcore
    from shardcore.cost.search import search
    from shardcore.testing import RankPool

    start = time.perf_counter()
    with shardcore.init_empty():
        meta = build(name)
    plan = search(meta, args.world, profile, seq=seq, batch=args.batch)
    search_s = time.perf_counter() - start
    layouts = [row["layout"] for row in plan["ranked"]]
    with RankPool(args.world, timeout_s=3600, threads=1) as pool:
        ranks = pool.run(worker, name, seq, args.batch, layouts, args.warmup, args.steps)[0]
    measured = ranks["layouts"]
    refs = {}
    rows = []
    for row, m in zip(plan["ranked"], measured, strict=True):
        dp = row["layout"]["dp"]
        if dp not in refs:
            refs[dp] = reference_loss(name, seq, args.batch, dp)
        if abs(m["loss"] - refs[dp]) > 1e-4 * abs(refs[dp]):
            raise AssertionError(f"{name} seq {seq} {row['name']}: loss {m['loss']:.6f} != unsharded {refs[dp]:.6f}")
        rows.append({"name": row["name"], "layout": row["layout"], "predicted_s": row["step_s"],
                     "measured_s": m["step_s"], "rank0_phases_s": m["rank0_phases_s"], "cpu_s_per_rank": m["cpu_s_per_rank"],
                     "error": row["step_s"] / m["step_s"] - 1,
                     "predicted": {k: row[k] for k in ("compute_s", "bubble_s", "communication_s", "memory_bytes")}})  # fmt: skip
    fastest = min(r["measured_s"] for r in rows)
    chosen = plan["best"]["name"]
    order = sorted(rows, key=lambda r: r["measured_s"])
    rank = next(i for i, r in enumerate(order) if r["name"] == chosen) + 1
    chosen_s = next(r["measured_s"] for r in rows if r["name"] == chosen)
    return {"model": name, "seq": seq, "batch": args.batch, "search_s": search_s, "chosen": chosen,
            "chosen_rank": rank, "chosen_over_fastest": chosen_s / fastest, "fastest": order[0]["name"],
            "layouts": rows, "refused": plan["refused"], "block_flops_beside": ranks["block_flops"]}  # fmt: skip


def report(results: list[dict], profile: dict, out: pathlib.Path, world: int) -> None:
    errors = []
    for r in results:
        print(f"\n{r['model']} seq {r['seq']} x batch {r['batch']}: chose {r['chosen']} - measured rank "
              f"{r['chosen_rank']} of {len(r['layouts'])}, {r['chosen_over_fastest']:.3f}x the fastest ({r['fastest']})")  # fmt: skip
        print("| layout | predicted s | measured s | error |")
        print("|---|---|---|---|")
        for row in sorted(r["layouts"], key=lambda x: x["measured_s"]):
            errors.append(abs(row["error"]))
            print(f"| {row['name']} | {row['predicted_s']:.3f} | {row['measured_s']:.3f} | {row['error']:+.0%} |")
    median = statistics.median(errors)
    print(f"\nmedian absolute error over {len(errors)} layouts: {median:.1%}")
    record = {"profile": profile, "world": world, "median_abs_error": median, "results": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"written: {out}")


def _block_flops(profile: dict, world: int) -> float:
    """The profile's reference-block FLOP/s a float32 rank gets with ``world`` ranks at work."""
    from shardcore.cost.model import per_rank

    return per_rank(profile, world)["block_flops"]["float32"]


def _measured(runs: list[dict], i: int, profile: dict, world: int) -> tuple[dict, dict, dict, list[float]]:
    """Case ``i`` of every run: per layout its step times, its CPU seconds over the cores, its steps at the profile's
    machine speed (runs that timed it beside them); and each such run's speed over the profile's."""
    name, seq = runs[0]["results"][i]["model"], runs[0]["results"][i]["seq"]
    times: dict[str, list[float]] = {}
    busy: dict[str, list[float]] = {}  # every rank's CPU seconds per step over the cores (runs that recorded it)
    steady: dict[str, list[float]] = {}
    speeds = []
    for run_ in runs:
        assert (run_["results"][i]["model"], run_["results"][i]["seq"]) == (name, seq)
        cores = run_["profile"]["cpu_count"]
        beside = run_["results"][i].get("block_flops_beside")
        speed = statistics.fmean(beside) / _block_flops(profile, world) if beside else None
        speeds += [speed] if speed is not None else []
        for row in run_["results"][i]["layouts"]:
            times.setdefault(row["name"], []).append(row["measured_s"])
            if speed is not None:  # the machine ran at `speed` x the profile's: its step at the profile's speed
                steady.setdefault(row["name"], []).append(row["measured_s"] * speed)
            if row.get("cpu_s_per_rank"):
                busy.setdefault(row["name"], []).append(sum(row["cpu_s_per_rank"]) / cores)
    return times, busy, steady, speeds


def summarize(path: pathlib.Path, png: pathlib.Path | None, profile: dict | None = None) -> dict:
    """Today's cost model scored on the repeated runs at ``path`` (see the module docstring), with
    the profile the runs read or ``profile`` (this machine measured again)."""
    import shardcore
    from shardcore.cost.search import search

    runs = json.loads(path.read_text())["runs"]
    profile = profile or runs[0]["profile"]  # every run read the same cached profile
    world = runs[0].get("world", WORLD)
    cases, errors, drifted, speeds = [], [], [], []
    for i, first in enumerate(runs[0]["results"]):
        name, seq, batch = first["model"], first["seq"], first["batch"]
        times, busy, steady, speed = _measured(runs, i, profile, world)
        speeds += speed
        with shardcore.init_empty():
            meta = build(name)
        plan = search(meta, world, profile, seq=seq, batch=batch)
        predicted = {row["name"]: row["step_s"] for row in plan["ranked"]}
        gone = sorted(set(times) - set(predicted))
        assert not gone, f"{name} seq {seq}: the runs measured layouts the search no longer ranks: {gone}"
        unmeasured = sorted(set(predicted) - set(times))  # ranked since the runs: not scored, listed
        rows = sorted(({"name": n, "predicted_s": predicted[n], "measured_s": statistics.median(t), "min_s": min(t),
                        "max_s": max(t), "runs": len(t), "error": predicted[n] / statistics.median(t) - 1,
                        "cpu_over_cores_s": statistics.median(busy[n]) if n in busy else None,
                        "error_at_profile_speed": predicted[n] / statistics.median(steady[n]) - 1 if n in steady else None}
                       for n, t in times.items()), key=lambda r: r["measured_s"])  # fmt: skip
        errors += [abs(r["error"]) for r in rows]
        drifted += [abs(r["error_at_profile_speed"]) for r in rows if r["error_at_profile_speed"] is not None]
        chosen = plan["best"]["name"]
        rank = next((k + 1 for k, r in enumerate(rows) if r["name"] == chosen), None)  # None: chosen, unmeasured
        over = rows[rank - 1]["measured_s"] / rows[0]["measured_s"] if rank else None
        cases.append({"model": name, "seq": seq, "batch": batch, "chosen": chosen, "chosen_rank": rank,
                      "chosen_over_fastest": over, "fastest": rows[0]["name"], "layouts": rows,
                      "unmeasured": unmeasured})  # fmt: skip
        verdict = (f"rank {rank} of {len(rows)} by the median of {len(runs)} runs, {over:.3f}x the fastest "
                   f"({rows[0]['name']})" if rank else "not among the layouts the runs measured")  # fmt: skip
        print(f"\n{name} seq {seq} x batch {batch}: chose {chosen} - {verdict}")
        if unmeasured:
            print(f"ranked since the runs, not measured: {', '.join(unmeasured)}")
        _table(rows)
    median = statistics.median(errors)
    worst = max(errors)
    measured = [c for c in cases if c["chosen_over_fastest"] is not None]  # the chosen layout among the runs'
    within = sum(c["chosen_over_fastest"] <= 1.10 for c in measured)
    print(f"\nmedian absolute error over {len(errors)} layouts: {median:.1%} (worst {worst:.0%}, "
          f"{sum(e <= 0.15 for e in errors)} within 15%); chosen within 10% of the fastest: {within} of the {len(measured)} "
          f"cases whose chosen layout the runs measured ({len(cases)} cases)")  # fmt: skip
    steady = _at_profile_speed(drifted, speeds)
    summary = {"source": str(path), "runs": len(runs), "world": world, "median_abs_error": median, "worst_abs_error": worst,
               "within_15pct": sum(e <= 0.15 for e in errors), "chosen_within_10pct": within,
               "at_profile_speed": steady, "cases": cases, "profile": profile}  # fmt: skip
    out = path.with_name(f"{path.stem}_summary.json")  # auto.json: auto_summary.json
    out.write_text(json.dumps(summary, indent=2))
    print(f"written: {out}")
    if png:
        draw(cases, png, world)
    return summary


def _table(rows: list[dict]) -> None:
    print(
        "| layout | predicted s | measured s, median (min-max) | error | all ranks' CPU s / cores "
        "| error at the profile's speed |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        cpu = "" if r["cpu_over_cores_s"] is None else f"{r['cpu_over_cores_s']:.3f}"
        steady_error = "" if r["error_at_profile_speed"] is None else f"{r['error_at_profile_speed']:+.0%}"
        print(f"| {r['name']} | {r['predicted_s']:.3f} | {r['measured_s']:.3f} ({r['min_s']:.3f}-{r['max_s']:.3f}) "
              f"| {r['error']:+.0%} | {cpu} | {steady_error} |")  # fmt: skip


def _at_profile_speed(drifted: list[float], speeds: list[float]) -> dict | None:
    """The errors with each run's step scaled to the profile's machine speed (:func:`machine_speed`): ``None`` where
    no run timed it."""
    steady = None
    if drifted:
        steady = {"median_abs_error": statistics.median(drifted), "worst_abs_error": max(drifted),
                  "within_15pct": sum(e <= 0.15 for e in drifted), "layouts": len(drifted),
                  "speed_min": min(speeds), "speed_max": max(speeds)}  # fmt: skip
        print(f"the machine beside the runs: {min(speeds):.2f}-{max(speeds):.2f}x the profile's block rate; at the "
              f"profile's speed: median absolute error {steady['median_abs_error']:.1%} (worst "
              f"{steady['worst_abs_error']:.0%}, {steady['within_15pct']} of {len(drifted)} within 15%)")  # fmt: skip
    return steady


def draw(cases: list[dict], png: pathlib.Path, world: int = WORLD) -> None:
    """Predicted against measured step time, one point per layout (the runs' min-max as a bar),
    the chosen layouts ringed, y = x and the 25% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6))
    markers = {"llama": "o", "bert": "s", "moe": "^"}
    colors = {128: "#4C72B0", 512: "#DD8452"}
    for c in cases:
        xs = [r["measured_s"] for r in c["layouts"]]
        ys = [r["predicted_s"] for r in c["layouts"]]
        err = [
            [r["measured_s"] - r["min_s"] for r in c["layouts"]],
            [r["max_s"] - r["measured_s"] for r in c["layouts"]],
        ]
        ax.errorbar(xs, ys, xerr=err, fmt=markers.get(c["model"], "o"), color=colors.get(c["seq"], "gray"),
                    alpha=0.8, ms=6, elinewidth=0.8, label=f"{c['model']} seq {c['seq']}")  # fmt: skip
        best = next(r for r in c["layouts"] if r["name"] == c["chosen"])
        ax.plot(best["measured_s"], best["predicted_s"], "o", ms=14, mfc="none", mec="black")
    top = max(max(r["measured_s"], r["predicted_s"]) for c in cases for r in c["layouts"]) * 1.1
    line = [0, top]
    ax.plot(line, line, "k-", lw=0.8)
    ax.fill_between(line, [0.75 * x for x in line], [1.25 * x for x in line], color="gray", alpha=0.15, label="±25%")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="measured step time, s (median of the runs, min-max)",
           ylabel="predicted step time, s", title=f"explain --auto's cost model, {world} gloo ranks (ringed: chosen)")  # fmt: skip
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"written: {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "bert", "moe"])
    parser.add_argument("--seqs", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--world", type=int, default=WORLD, help="gloo ranks (the profile measures 2 and 4)")
    parser.add_argument("--profile", default=None, help="a profile JSON (default: this machine's, measured if absent); "
                        "with --summarize: predict from it instead of the profile the runs read")  # fmt: skip
    parser.add_argument("--out", default="bench-results/auto.json")
    parser.add_argument("--summarize", default=None, help="score the cost model on repeat.py's merged runs instead")
    parser.add_argument("--png", default=None, help="with --summarize: the predicted-vs-measured plot")
    args = parser.parse_args()
    if args.summarize:
        from shardcore.cost import load_profile

        again = load_profile(args.profile) if args.profile else None
        summarize(pathlib.Path(args.summarize), pathlib.Path(args.png) if args.png else None, again)
        return
    from shardcore.cost import load_profile

    profile = load_profile(args.profile, group_sizes=(2, 4))
    results = []
    for name in args.models:
        for seq in args.seqs:
            results.append(run(name, seq, args, profile))
            print(f"{name} seq {seq}: done", flush=True)
    report(results, profile, pathlib.Path(args.out), args.world)


if __name__ == "__main__":
    main()
