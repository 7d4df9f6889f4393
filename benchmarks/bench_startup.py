"""Benchmark (not a test): what starting shardcore costs, in fresh processes.

    python benchmarks/bench_startup.py [--repeats 5] [--root PATH] [--out PATH]

Each command runs ``--repeats`` times in a process of its own; its CPU time (user + system, from
the child's resource usage) and its wall time are recorded, min / median / max:

* ``torch``: ``import torch`` alone, the floor every other line stands on;
* ``import shardcore``: ``import torch, shardcore``; its line also gives ``shardcore's own``, the
  median CPU time over ``torch``'s (the issue's bar: at most 0.5 s on the 2-core CI machine);
* ``shardcore --help``, ``shardcore plugins`` and ``shardcore explain`` (a 2-layer Llama config at
  TP=2, on the meta device): what a command-line user waits for.

``--root`` measures another checkout (a ``git worktree`` of an older commit: the "before" of a
change) with this script. Writes ``--out`` (JSON; default ``benchmarks/results/startup.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
}


def commands(config_dir: str) -> dict[str, list[str]]:
    py = [sys.executable]
    return {
        "torch": [*py, "-c", "import torch"],
        "import shardcore": [*py, "-c", "import torch, shardcore"],
        "shardcore --help": [*py, "-m", "shardcore", "--help"],
        "shardcore plugins": [*py, "-m", "shardcore", "plugins"],
        "shardcore explain": [*py, "-m", "shardcore", "explain", config_dir, "--tp", "2"],
    }


def timed(argv: list[str], env: dict, cwd: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``argv`` in a fresh process; raises if it fails. It runs
    in ``cwd``, an empty folder: ``python -c`` puts its working directory before ``PYTHONPATH``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def spread(values: list[float]) -> dict:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", default=str(ROOT), help="the checkout to measure (default: this one)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "startup.json"))
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root).resolve()
    plugins = [str(p) for p in sorted((root / "plugins").iterdir()) if p.is_dir()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *plugins])}
    rows = {}
    with tempfile.TemporaryDirectory() as config_dir:
        pathlib.Path(config_dir, "config.json").write_text(json.dumps(LLAMA))
        check = [sys.executable, "-c", "import shardcore; print(shardcore.__file__)"]
        found = subprocess.run(check, env=env, cwd=config_dir, check=True, capture_output=True, text=True).stdout
        if not found.strip().startswith(str(root)):
            raise SystemExit(f"the processes import shardcore from {found.strip()}, not from {root}")
        for name, command in commands(config_dir).items():
            runs = [timed(command, env, config_dir) for _ in range(args.repeats)]
            rows[name] = {"cpu_s": spread([c for c, _ in runs]), "wall_s": spread([w for _, w in runs])}
            print(f"{name:20s} CPU {rows[name]['cpu_s']}  wall {rows[name]['wall_s']}", flush=True)
    own = rows["import shardcore"]["cpu_s"]["median"] - rows["torch"]["cpu_s"]["median"]
    print(f"shardcore's own import: {own:.3f} s of CPU (median over torch's)")
    record = {
        "root": str(root),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "repeats": args.repeats,
        "commands": rows,
        "shardcore_own_import_cpu_s": round(own, 3),
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
