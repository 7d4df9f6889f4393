"""Benchmark (not a test): the optimization switches on and off, TP=2, on the CPU.

    python benchmarks/bench_kernels.py [--models llama bert] [--seqs 256 1024] [--steps 5] [--warmup 2]

Starts 2 gloo ranks (1 thread each). For the Llama bench model of ``bench_llama_tp.py`` and a
BERT of the same width, each sharded at TP=2, measures the forward+backward step (median of
``--steps`` after ``--warmup``; the slowest rank's time) of:

* ``eager``: the model built with its eager attention (``attn_implementation="eager"``), no switch;
* ``sdpa (as built)``: built with transformers' SDPA attention, no switch (what users usually get);
* ``+flash_attention``: ``enable_flash_attention=True`` on the eager-built model (here: SDPA via
  shardcore's registry function, grouped K/V not repeated);
* ``+fused_norm``: ``enable_fused_normalization=True`` (on the SDPA-built model);
* ``+jit_fused``: ``enable_jit_fused=True`` (on the SDPA-built model; compile time is in the warmup);
* ``all``: ``enable_all_optimization=True`` on the eager-built model;
* ``inference_only (fwd)`` vs ``default (fwd)``: a forward without ``torch.no_grad()``, as a
  serving loop that forgot it would run, with and without ``inference_only=True``.

Every contestant's first loss must equal the eager one (relative 1e-4) or the run stops. Ratios
are to ``eager`` and to ``sdpa (as built)`` in the same run. Writes ``bench-results/kernels.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_common import slowest
from bench_llama_tp import CONFIG as LLAMA

BERT = {
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "vocab_size": 8192,
    "max_position_embeddings": 1024,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
BATCH = 4


def build(model: str, attn: str):
    import transformers

    if model == "llama":
        cfg, cls = transformers.LlamaConfig(**LLAMA), transformers.LlamaForCausalLM
    else:
        cfg, cls = transformers.BertConfig(**BERT), transformers.BertForMaskedLM
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return cls(cfg)


CONTESTANTS = {
    "eager": ("eager", {}),
    "sdpa (as built)": ("sdpa", {}),
    "+flash_attention": ("eager", {"enable_flash_attention": True}),
    "+fused_norm": ("sdpa", {"enable_fused_normalization": True}),
    "+jit_fused": ("sdpa", {"enable_jit_fused": True}),
    "all": ("eager", {"enable_all_optimization": True}),
}


def time_steps(model, batch, warmup: int, steps: int, backward: bool = True) -> float:
    times = []
    for i in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        start = time.perf_counter()
        loss = model(**batch).loss
        if backward:
            loss.backward()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return slowest(statistics.median(times))


def peak_forward_bytes(model, batch) -> int:
    """Bytes the autograd graph of one forward keeps alive: the tensors its nodes saved for
    backward (each storage once), found by walking the graph from the loss."""
    seen, storages, total = set(), set(), 0
    out = model(**batch)
    stack = [out.loss.grad_fn] if out.loss.grad_fn is not None else []
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        for name in dir(fn):
            if name.startswith("_saved_"):
                value = getattr(fn, name, None)
                if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in storages:
                    storages.add(value.untyped_storage().data_ptr())
                    total += value.untyped_storage().nbytes()
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return total


def worker(args) -> list[dict]:
    import shardcore

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    results = []
    for model_name in args.models:
        vocab = LLAMA["vocab_size"] if model_name == "llama" else BERT["vocab_size"]
        for seq in args.seqs:
            g = torch.Generator().manual_seed(seq)
            ids = torch.randint(0, vocab, (BATCH, seq), generator=g)
            batch = {"input_ids": ids, "labels": ids}
            reference = None
            for name, (attn, switches) in CONTESTANTS.items():
                model = shardcore.optimize(
                    build(model_name, attn), shardcore.ShardConfig(tensor_parallel_size=world, **switches)
                )
                with torch.no_grad():
                    loss = model(**batch).loss.item()
                reference = loss if reference is None else reference
                if abs(loss - reference) > 1e-4 * abs(reference):
                    raise AssertionError(f"{model_name} seq {seq}: {name} loss {loss:.6f} != eager {reference:.6f}")
                step = time_steps(model, batch, args.warmup, args.steps)
                results.append(
                    {
                        "model": model_name,
                        "seq": seq,
                        "name": name,
                        "step_s": step,
                        "loss": loss,
                        "kernels": dict(model.shardcore.kernels),
                    }
                )
                del model
            # inference_only vs default, forward only, no torch.no_grad()
            for name, extra in (("default (fwd)", {}), ("inference_only (fwd)", {"inference_only": True})):
                model = shardcore.optimize(
                    build(model_name, "sdpa"), shardcore.ShardConfig(tensor_parallel_size=world, **extra)
                ).eval()
                step = time_steps(model, batch, args.warmup, args.steps, backward=False)
                saved = peak_forward_bytes(model, batch)
                results.append({"model": model_name, "seq": seq, "name": name, "step_s": step, "graph_bytes": saved})
                del model
    return results if rank == 0 else []


def report(results: list[dict], out: pathlib.Path) -> None:
    print(f"\nTP=2 on 2 gloo ranks x 1 thread, batch {BATCH}; Llama {LLAMA}; BERT {BERT}\n")
    print(f"{'model':<6} {'seq':>5}  {'contestant':<22}{'step s':>8}  {'vs eager':>9}  {'vs sdpa':>8}  notes")
    for model in sorted({r["model"] for r in results}, reverse=True):
        for seq in sorted({r["seq"] for r in results}):
            rows = {r["name"]: r for r in results if r["seq"] == seq and r["model"] == model}
            eager, sdpa, fwd = rows["eager"], rows["sdpa (as built)"], rows["default (fwd)"]
            for r in rows.values():
                if "graph_bytes" in r:
                    r["vs_default_fwd"] = r["step_s"] / fwd["step_s"]
                    note = f"{r['vs_default_fwd']:.2f}x default fwd; autograd graph {r['graph_bytes'] / 2**20:.1f} MB"
                    print(f"{model:<6} {seq:>5}  {r['name']:<22}{r['step_s']:>8.3f}  {'':>9}  {'':>8}  {note}")
                    continue
                r["vs_eager"], r["vs_sdpa"] = r["step_s"] / eager["step_s"], r["step_s"] / sdpa["step_s"]
                note = "; ".join(f"{k}: {v}" for k, v in r["kernels"].items())
                print(
                    f"{model:<6} {seq:>5}  {r['name']:<22}{r['step_s']:>8.3f}  {r['vs_eager']:>8.2f}x  "
                    f"{r['vs_sdpa']:>7.2f}x  {note}"
                )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"llama": LLAMA, "bert": BERT, "batch": BATCH, "results": results}, indent=2))
    print(f"\nwritten: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "bert"], choices=["llama", "bert"])
    parser.add_argument("--seqs", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="bench-results/kernels.json")
    args = parser.parse_args()
    from shardcore.testing import RankPool

    pool = RankPool(2, timeout_s=7200, threads=1)
    try:
        results = pool.run(worker, args)[0]
    finally:
        pool.close()
    report(results, pathlib.Path(args.out))


if __name__ == "__main__":
    main()
