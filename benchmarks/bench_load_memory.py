"""Benchmark (not a test): host memory and time to load a ~0.9 GB Llama checkpoint at TP=2.

    python benchmarks/bench_load_memory.py [--dir /tmp/shardcore-bench-ckpt]

Writes a Llama (hidden 1024, 12 layers, vocab 32000, fp32) with ``save_pretrained`` once, then
measures, each in fresh processes so baselines are clean:

* ``shardcore``: the model built on the meta device, ``shardcore.optimize`` at TP=2, then
  ``shardcore.load_checkpoint`` (each rank reads only its slices) — 2 gloo ranks;
* ``shardcore_copy``: the same with ``load_checkpoint(..., zero_copy=False)`` (everything read
  into memory up front, no views of the memory-mapped file);
* ``hf_tp_plan``: ``from_pretrained(path, tp_plan="auto")`` — HuggingFace's own TP, 2 gloo ranks;
* ``hf_unsharded``: ``from_pretrained(path)`` in one process.

Every contestant's window holds everything from nothing to a loaded model: for shardcore the
meta build, ``optimize`` and the load; for HuggingFace ``from_pretrained``, which builds and
shards itself. Per rank: the peak resident-set size in that window above the RSS just before it
(the kernel's high-water mark, reset through ``/proc/self/clear_refs``) and the wall time. Then
one forward pass runs and *every* parameter is read (summed), so the second figure, the RSS
increase after use, counts the weights a memory-mapped load leaves in the file until first
touched. For ``hf_tp_plan`` the bytes its plan keeps replicated on every rank (parameters that
are not split) are reported too. Prints a table and writes ``bench-results/load_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_common import rss_kb

CONFIG = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}


def _measure(fn) -> tuple[float, float, float, float]:
    """(peak RSS increase in MB during ``fn()``, seconds, RSS increase in MB after use, MB replicated).

    "After use" counts what a lazily memory-mapped load defers: weights left as views of the
    checkpoint file enter the resident set only when touched, so every parameter is read first.
    """
    import gc

    gc.collect()
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = rss_kb("VmRSS")
    start = time.perf_counter()
    model = fn()
    seconds = time.perf_counter() - start
    peak = rss_kb("VmHWM")
    with torch.no_grad():
        model(input_ids=torch.ones(1, 8, dtype=torch.long))
        for param in model.parameters():  # touch every weight, not only those an 8-token forward reads
            (param.to_local() if hasattr(param, "to_local") else param).sum()
    after_use = rss_kb("VmRSS")
    replicated = _replicated_mb(model)
    del model
    return (peak - before) / 1024, seconds, (after_use - before) / 1024, replicated


def _replicated_mb(model) -> float:
    """MB of parameters this rank holds whole (not split over the ranks): DTensors whose local
    shard is the whole tensor, and shardcore parameters without a ShardSpec."""
    from shardcore.sharded_state import parameter_specs

    split = set(parameter_specs(model))
    total = 0
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        if name not in split and local.shape == param.shape:
            total += local.numel() * local.element_size()
    return total / 2**20


def _measure_on_rank(method: str, path: str) -> dict:
    """Runs on every rank of a fresh :class:`shardcore.testing.RankPool` (gloo, 1 thread per rank)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import shardcore

    rank, world = dist.get_rank(), dist.get_world_size()

    def shardcore_load(zero_copy: bool):
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**CONFIG))
        model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=world))
        return shardcore.load_checkpoint(model, path, zero_copy=zero_copy)

    if method in ("shardcore", "shardcore_copy"):
        mb, seconds, used, replicated = _measure(lambda: shardcore_load(method == "shardcore"))
    elif method == "hf_tp_plan":
        mb, seconds, used, replicated = _measure(lambda: LlamaForCausalLM.from_pretrained(path, tp_plan="auto"))
    else:
        mb, seconds, used, replicated = _measure(lambda: LlamaForCausalLM.from_pretrained(path))
    return {
        "method": method,
        "rank": rank,
        "peak_rss_increase_mb": mb,
        "seconds": seconds,
        "rss_increase_after_use_mb": used,
        "replicated_mb": replicated,
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
    parser.add_argument("--methods", nargs="+", default=["shardcore", "shardcore_copy", "hf_tp_plan", "hf_unsharded"])
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
        f"{'method':<15}{'rank':>5}  {'peak RSS increase MB':>21}  {'x checkpoint':>12}  {'seconds':>8}  "
        f"{'RSS after use MB':>17}  {'x checkpoint':>12}  {'replicated MB':>13}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['method']:<15}{r['rank']:>5}  failed: {r['error']}")
            continue
        r["x_checkpoint"] = r["peak_rss_increase_mb"] / size_mb
        r["after_use_x_checkpoint"] = r["rss_increase_after_use_mb"] / size_mb
        print(
            f"{r['method']:<15}{r['rank']:>5}  {r['peak_rss_increase_mb']:>21.0f}  {r['x_checkpoint']:>11.3f}x  "
            f"{r['seconds']:>8.2f}  {r['rss_increase_after_use_mb']:>17.0f}  {r['after_use_x_checkpoint']:>11.3f}x  "
            f"{r['replicated_mb']:>13.0f}"
        )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": CONFIG, "checkpoint_mb": size_mb, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
