"""Benchmark (not a test): start-up time and peak RSS of ``shardcore.parallelize`` at world_size 2
for a ~1 GB Llama checkpoint, against loading it unsharded in one process.

    python benchmarks/bench_parallelize.py [--dir /tmp/shardcore-bench-parallelize] [--world 2]

Writes a Llama (hidden 1024, 16 layers, 8 KV heads, vocab 32000, fp32, ~0.96 GiB of safetensors) with
``save_pretrained`` once. Each contestant then runs in a fresh ``python`` process (no torchrun),
so every baseline is clean:

* ``unsharded``: ``LlamaForCausalLM.from_pretrained(path)``, then greedy ``generate`` of 16 tokens;
* ``parallelize(path)``: ``shardcore.parallelize(path, world_size=2)``, then the same ``generate``
  through the handle;
* ``parallelize(module)``: the model is first loaded unsharded in the caller (as a user holding a
  model would), then ``shardcore.parallelize(model, world_size=2)``.

Per process: the peak resident-set size (the kernel's high-water mark, ``VmHWM``, which also
counts pages of the memory-mapped checkpoint), and that peak above the RSS of the same process
right after importing torch, transformers and shardcore (the "model" part; a worker's import
baseline is measured in a separate pool of workers that import the same modules). After the
``generate`` every parameter is read, so lazily mapped weights are counted too. Start-up is the
wall time from the call to a ready model; for ``parallelize`` it includes starting the worker
interpreters and importing torch and transformers there, which the separate baseline pool times
on its own ("processes+imports"). Prints a table; writes ``bench-results/parallelize.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

CONFIG = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
PROMPT = [[1, 306, 4658, 278, 6593, 310, 2834, 338]]
NEW_TOKENS = 16


def _kb(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _imports() -> None:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401

    import shardcore  # noqa: F401


def _worker_baseline() -> float:
    """In a fresh worker: RSS (MB) after the imports a parallelize worker does."""
    _imports()
    return _kb("VmRSS") / 1024


def _worker_peak() -> dict:
    """In a parallelize worker, after the generate: touch every parameter, report RSS."""
    import torch

    from shardcore.inference import _MODELS

    with torch.no_grad():
        for model in _MODELS.values():
            for p in model.parameters():
                p.sum()
    return {"peak_mb": _kb("VmHWM") / 1024, "after_use_mb": _kb("VmRSS") / 1024}


def child(method: str, path: str, world: int) -> dict:
    """One contestant, in this fresh process."""
    _imports()
    import torch
    from transformers import LlamaForCausalLM

    import shardcore

    baseline = _kb("VmRSS") / 1024
    prompt = torch.tensor(PROMPT)
    gen = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": 0}
    rows = []
    if method == "unsharded":
        start = time.perf_counter()
        model = LlamaForCausalLM.from_pretrained(path).eval()
        ready = time.perf_counter() - start
        start = time.perf_counter()
        with torch.no_grad():
            tokens = model.generate(prompt, **gen)
            for p in model.parameters():
                p.sum()
        generate_s = time.perf_counter() - start
        rows.append({"process": "caller", "baseline_mb": baseline, "peak_mb": _kb("VmHWM") / 1024})
    else:
        from shardcore.testing import RankPool

        source = path
        if method == "parallelize(module)":
            source = LlamaForCausalLM.from_pretrained(path).eval()
        start = time.perf_counter()
        handle = shardcore.parallelize(source, world_size=world)
        ready = time.perf_counter() - start
        start = time.perf_counter()
        tokens = handle.generate(prompt, **gen)
        generate_s = time.perf_counter() - start
        workers = handle._pool.run(_worker_peak)
        rows.append({"process": "caller", "baseline_mb": baseline, "peak_mb": _kb("VmHWM") / 1024})
        for rank, w in enumerate(workers):
            rows.append({"process": f"worker {rank}", **w})
        handle.close()
        start = time.perf_counter()  # after the run, so both find the libraries in the page cache
        with RankPool(world, threads=1) as pool:  # the workers' import baseline, in the same kind of process
            worker_baselines = pool.run(_worker_baseline)
        processes_s = time.perf_counter() - start  # start-up cost that is not the model's: processes + imports
        for rank, b in enumerate(worker_baselines):
            rows[1 + rank]["baseline_mb"] = b
    return {
        "method": method,
        "ready_s": ready,
        "processes_s": processes_s if method != "unsharded" else 0.0,
        "generate_s": generate_s,
        "tokens": tokens.tolist(),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/shardcore-bench-parallelize")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--out", default="bench-results/parallelize.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.dir, args.world)))
        return
    path = pathlib.Path(args.dir)
    if not (path / "model.safetensors").exists() and not (path / "model.safetensors.index.json").exists():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(path)
    size_mb = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20
    results = []
    for method in ("unsharded", "parallelize(path)", "parallelize(module)"):
        done = subprocess.run(
            [sys.executable, __file__, "--child", method, "--dir", str(path), "--world", str(args.world)],
            capture_output=True,
            text=True,
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{method} failed:\n{done.stderr[-3000:]}")
            continue
        results.append(json.loads(line[len("RESULT ") :]))
    reference = results[0]["tokens"] if results and results[0]["method"] == "unsharded" else None
    print(f"\nLlama {CONFIG}: checkpoint {size_mb:.0f} MB (fp32 safetensors), world_size {args.world}\n")
    print(
        f"{'method':<21}{'ready s':>8}{'of which processes+imports s':>29}{'generate s':>11}  {'process':<9}{'peak RSS MB':>12}{'x ckpt':>8}"
        f"{'import MB':>10}{'peak-import MB':>15}{'x ckpt':>8}"
    )
    for r in results:
        r["same_tokens_as_unsharded"] = r["tokens"] == reference
        for i, row in enumerate(r["rows"]):
            row["x_checkpoint"] = row["peak_mb"] / size_mb
            row["model_mb"] = row["peak_mb"] - row["baseline_mb"]
            row["model_x_checkpoint"] = row["model_mb"] / size_mb
            head = (
                f"{r['method']:<21}{r['ready_s']:>8.1f}{r['processes_s']:>29.1f}{r['generate_s']:>11.2f}"
                if i == 0
                else " " * 69
            )
            print(
                f"{head}  {row['process']:<9}{row['peak_mb']:>12.0f}{row['x_checkpoint']:>7.2f}x"
                f"{row['baseline_mb']:>10.0f}{row['model_mb']:>15.0f}{row['model_x_checkpoint']:>7.2f}x"
            )
    print("\ntokens equal to unsharded:", {r["method"]: r["same_tokens_as_unsharded"] for r in results})
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": CONFIG, "checkpoint_mb": size_mb, "results": results}, indent=2))


if __name__ == "__main__":
    main()
