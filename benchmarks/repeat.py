"""Run a benchmark several times and keep every run and their spread, committed beside the tables.

    python benchmarks/repeat.py --name llama_tp [--repeats 3] -- python benchmarks/bench_llama_tp.py [ARGS]

Each repeat is a fresh run of the command with ``--out`` pointing at a scratch file (every
benchmark here takes ``--out``). The runs are then merged into ``benchmarks/results/NAME.json``:
``"runs"`` holds each run's own JSON, ``"summary"`` the same structure with every number that
differs between runs replaced by ``{"median", "min", "max"}`` (numbers equal in every run, and
anything else, kept as they are). The tables in docs/ quote the medians with their min-max.
``--repeats`` defaults to ``$BENCH_REPEATS`` or 3.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def merge(values: list):
    """One structure from the runs' equally shaped ones: differing numbers become their spread."""
    first = values[0]
    if all(_is_number(v) for v in values):
        if all(v == first for v in values):
            return first
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}
    if all(isinstance(v, dict) for v in values) and all(v.keys() == first.keys() for v in values):
        return {k: merge([v[k] for v in values]) for k in first}
    if all(isinstance(v, list) for v in values) and all(len(v) == len(first) for v in values):
        return [merge([v[i] for v in values]) for i in range(len(first))]
    return first if all(v == first for v in values) else {"per_run": values}


def spread(x) -> str:
    """``median (min-max)`` of a merged number, or the number."""
    if isinstance(x, dict) and "median" in x:
        return f"{x['median']:.4g} ({x['min']:.4g}-{x['max']:.4g})"
    return f"{x:.4g}" if _is_number(x) else str(x)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", "3")))
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    runs, seconds = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.repeats):
            out = pathlib.Path(scratch) / f"run{i}.json"
            print(f"== {args.name}: repeat {i + 1}/{args.repeats}: {' '.join(command)}", flush=True)
            start = time.perf_counter()
            subprocess.run([*command, "--out", str(out)], check=True, cwd=ROOT)
            seconds.append(round(time.perf_counter() - start, 1))
            runs.append(json.loads(out.read_text()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    record = {
        "command": " ".join(command),
        "repeats": args.repeats,
        "seconds_per_run": seconds,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "summary": merge(runs),
        "runs": runs,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)} ({args.repeats} runs, {sum(seconds):.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
