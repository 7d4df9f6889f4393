"""Benchmark (not a test): host memory and time to load a ~0.9 GB Llama checkpoint at TP=2.

    python benchmarks/bench_load_memory.py [--dir /tmp/shardcore-bench-ckpt]

Writes a Llama (hidden 1024, 12 layers, vocab 32000, fp32) with ``save_pretrained`` once, then
measures, each in fresh processes so baselines are clean:

* ``shardcore``: the model built on the meta device, ``shardcore.optimize`` at TP=2, then
  ``shardcore.load_checkpoint`` (each rank reads only its slices) — 2 gloo ranks;
* ``hf_tp_plan``: ``from_pretrained(path, tp_plan="auto")`` — HuggingFace's own TP, 2 gloo ranks;
* ``hf_unsharded``: ``from_pretrained(path)`` in one process.

Per rank: the peak resident-set size during the load above the RSS just before it (the kernel's
high-water mark, reset through ``/proc/self/clear_refs``) and the wall time. Prints a table and
writes ``bench-results/load_memory.json``. A second figure, the RSS increase after one forward
pass, counts the weights a memory-mapped load leaves in the file until they are first used.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch
import torch.distributed as dist

CONFIG = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}


def _rss_kb(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _measure(fn) -> tuple[float, float, float]:
    """(peak RSS increase in MB during ``fn()``, seconds, RSS increase in MB after a forward pass).

    The last figure counts what a lazily memory-mapped load defers: weights left as views of the
    checkpoint file enter the resident set only when a forward pass touches them.
    """
    import gc

    gc.collect()
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = _rss_kb("VmRSS")
    start = time.perf_counter()
    model = fn()
    seconds = time.perf_counter() - start
    peak = _rss_kb("VmHWM")
    with torch.no_grad():
        model(input_ids=torch.ones(1, 8, dtype=torch.long))
    after_forward = _rss_kb("VmRSS")
    del model
    return (peak - before) / 1024, seconds, (after_forward - before) / 1024


def _measure_on_rank(method: str, path: str) -> dict:
    """Runs on every rank of a fresh :class:`shardcore.testing.RankPool` (gloo, 1 thread per rank)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import shardcore

    rank, world = dist.get_rank(), dist.get_world_size()
    if method == "shardcore":
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**CONFIG))
        model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=world))
        mb, seconds, used = _measure(lambda: shardcore.load_checkpoint(model, path))
    elif method == "hf_tp_plan":
        mb, seconds, used = _measure(lambda: LlamaForCausalLM.from_pretrained(path, tp_plan="auto"))
    else:
        mb, seconds, used = _measure(lambda: LlamaForCausalLM.from_pretrained(path))
    return {
        "method": method,
        "rank": rank,
        "peak_rss_increase_mb": mb,
        "seconds": seconds,
        "rss_increase_after_forward_mb": used,
    }


def run(method: str, world: int, path: str) -> list[dict]:
    """``method`` in fresh processes, so every baseline is clean."""
    from shardcore.testing import RankPool

    pool = RankPool(world, threads=1)
    try:
        return pool.run(_measure_on_rank, method, path)
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/shardcore-bench-ckpt")
    parser.add_argument("--out", default="bench-results/load_memory.json")
    parser.add_argument("--methods", nargs="+", default=["shardcore", "hf_tp_plan", "hf_unsharded"])
    args = parser.parse_args()
    path = pathlib.Path(args.dir)
    if not (path / "model.safetensors").exists() and not (path / "model.safetensors.index.json").exists():
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(path)
    size_mb = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20
    rows = []
    for method in args.methods:
        try:
            rows += run(method, 1 if method == "hf_unsharded" else 2, str(path))
        except Exception as exc:  # report and go on: one failing contestant should not hide the others
            rows.append({"method": method, "rank": "-", "error": f"{type(exc).__name__}: {exc}"})
    print(f"\nLlama {CONFIG}: checkpoint {size_mb:.0f} MB (fp32 safetensors)\n")
    print(
        f"{'method':<14}{'rank':>5}  {'peak RSS increase MB':>21}  {'x checkpoint':>12}  {'seconds':>8}  "
        f"{'RSS after a forward MB':>22}  {'x checkpoint':>12}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['method']:<14}{r['rank']:>5}  failed: {r['error']}")
            continue
        r["x_checkpoint"] = r["peak_rss_increase_mb"] / size_mb
        r["after_forward_x_checkpoint"] = r["rss_increase_after_forward_mb"] / size_mb
        print(
            f"{r['method']:<14}{r['rank']:>5}  {r['peak_rss_increase_mb']:>21.0f}  {r['x_checkpoint']:>11.3f}x  "
            f"{r['seconds']:>8.2f}  {r['rss_increase_after_forward_mb']:>22.0f}  {r['after_forward_x_checkpoint']:>11.3f}x"
        )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": CONFIG, "checkpoint_mb": size_mb, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
