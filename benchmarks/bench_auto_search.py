"""Benchmark (not a test): how long ``shardcore explain --auto`` takes to rank a 70B Llama's layouts
over 64 ranks, and that the layouts it ranks are unchanged.

    python benchmarks/bench_auto_search.py [--repeats 3] [--root PATH] [--profile FILE] [--out PATH]

Each repeat runs ``shardcore explain <Llama-3-70B-shaped config> --auto --world 64 --memory 80
--seq 4096 --batch 64 --json`` in a fresh process (the model built on the meta device, no weights)
and records the search's own seconds (the ``seconds`` its JSON reports: ranking every layout,
after the model is built), the whole command's CPU seconds (user + system) and its wall seconds,
min / median / max. The profile the cost model reads is ``--profile`` (default: the one committed
beside the results, ``benchmarks/results/auto_search_profile.json``, a ``shardcore calibrate`` of
the 2-core CI machine), so the ranking does not depend on the machine measuring.

The ranking's fingerprint (a hash of every ranked layout's name, predicted step time and memory,
in order, and every refusal's message) is printed and recorded; runs of two checkouts (``--root``,
a ``git worktree`` of the older commit, measured with this script) rank the same layouts the same
way when the fingerprints are equal. Writes ``--out`` (JSON; default
``benchmarks/results/auto_search.json``).
"""

from __future__ import annotations

import argparse
import hashlib
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
LLAMA_70B = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
ARGS = ["--auto", "--world", "64", "--memory", "80", "--seq", "4096", "--batch", "64", "--json"]


def fingerprint(result: dict) -> str:
    """A hash of the ranking: each ranked layout's name, step time, memory and fit, then each refusal."""
    ranked = [(r["name"], r["step_s"], r["memory_bytes"]["total"], r["fits"]) for r in result["ranked"]]
    refused = [(r["name"], r["refused"]) for r in result["refused"]]
    return hashlib.sha256(json.dumps([ranked, refused]).encode()).hexdigest()[:16]


def run_once(config_dir: str, profile: str, env: dict) -> tuple[dict, float, float]:
    """(the command's JSON, its CPU seconds, its wall seconds); raises if it fails."""
    argv = [sys.executable, "-m", "shardcore", "explain", config_dir, *ARGS, "--profile", profile]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=config_dir, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(done.stdout), cpu, wall


def spread(values: list[float]) -> dict:
    return {"min": round(min(values), 2), "median": round(statistics.median(values), 2), "max": round(max(values), 2)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default=str(ROOT), help="the checkout to measure (default: this one)")
    parser.add_argument("--profile", default=str(ROOT / "benchmarks" / "results" / "auto_search_profile.json"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "auto_search.json"))
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root).resolve()
    plugins = [str(p) for p in sorted((root / "plugins").iterdir()) if p.is_dir()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *plugins])}
    runs, prints = [], set()
    with tempfile.TemporaryDirectory() as config_dir:
        pathlib.Path(config_dir, "config.json").write_text(json.dumps(LLAMA_70B))
        for i in range(args.repeats):
            result, cpu, wall = run_once(config_dir, str(pathlib.Path(args.profile).resolve()), env)
            runs.append((result["seconds"], cpu, wall))
            prints.add(fingerprint(result))
            print(
                f"run {i + 1}: search {result['seconds']:.1f} s, command CPU {cpu:.1f} s, wall {wall:.1f} s", flush=True
            )
    if len(prints) != 1:
        raise SystemExit(f"the ranking differs between repeats: {sorted(prints)}")
    record = {
        "root": str(root),
        "command": "shardcore explain <70B Llama> " + " ".join(ARGS),
        "cpu_count": os.cpu_count(),
        "repeats": args.repeats,
        "layouts": result["candidates"],
        "ranked": len(result["ranked"]),
        "best": result["best"]["name"] if result["best"] else None,
        "fingerprint": prints.pop(),
        "search_s": spread([s for s, _, _ in runs]),
        "command_cpu_s": spread([c for _, c, _ in runs]),
        "command_wall_s": spread([w for _, _, w in runs]),
    }
    print(json.dumps(record, indent=1))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
