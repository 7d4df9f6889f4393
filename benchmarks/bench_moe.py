"""Benchmark (not a test): a small Mixtral-shaped model unsharded, at TP=2 and at EP=2, 2 gloo ranks.

    python benchmarks/bench_moe.py [--batch 4] [--seq 256] [--steps 4] [--warmup 2]

Trains ``MixtralForCausalLM`` (hidden 256, 4 layers, 8 experts of intermediate 512, top-2, 8
heads over 4 KV heads, vocabulary 4096; random weights, float32, the load-balancing loss in the
loss) with AdamW on one global batch of ``--batch`` x ``--seq`` random tokens, laid out as:

* ``unsharded``: the whole model, the whole batch, one process (one thread);
* ``TP=2``: ``ShardConfig(tensor_parallel_size=2)``: attention by heads, each rank 4 whole experts
  (the router replicated), both ranks run the whole batch;
* ``EP=2``: ``ShardConfig(tensor_parallel_size=1, expert_parallel_size=2, data_parallel="ddp")``:
  each rank half the batch, its 4 experts, the tokens routed to their experts by all-to-all, the
  dense weights DDP over the 2 ranks (``global_batch_balance=True``, so the loss is the whole
  batch's, as the other two compute it).

Each layout runs in fresh processes (2 ranks x 1 thread on this 2-core machine; the unsharded one,
1 process). Measured: the step time (median over ``--steps`` after ``--warmup``; a step ends when
the slowest rank does), the peak RSS per rank (``VmHWM``) and its increase over the RSS before
the model was built, the bytes of parameters + AdamW state per rank, the expert bytes per rank
over the unsharded experts', and shardcore's collectives per step (counted on the second step)
against ``shardcore explain``'s prediction for the layout (it must match, or the run stops). The
first loss of every layout must equal the unsharded one (relative 1e-4). Writes
``bench-results/moe.json``; nothing here compares with PyTorch's own tensor parallelism, which
has no plan for fused expert weights.
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
from bench_common import rss_kb, slowest

CONFIG = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "output_router_logits": True,
    "router_aux_loss_coef": 0.02,
}
LAYOUTS = {
    "unsharded": None,
    "TP=2": {"tensor_parallel_size": 2},
    "EP=2": {
        "tensor_parallel_size": 1,
        "expert_parallel_size": 2,
        "data_parallel": "ddp",
        "global_batch_balance": True,
    },
}


def build():
    import transformers

    config = transformers.MixtralConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    return transformers.MixtralForCausalLM(config)


def _expert_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)


def worker(args, name: str) -> dict:
    import shardcore
    from shardcore.distributed.collectives import count_collectives
    from shardcore.explain import explain
    from shardcore.testing import dp_part, state_bytes

    torch.set_num_threads(1)
    import transformers.models.mixtral.modeling_mixtral  # noqa: F401  imported before "before"

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (args.batch, args.seq), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    layout = LAYOUTS[name]
    before = rss_kb("VmRSS")
    torch.manual_seed(0)
    model = build()
    full_experts = _expert_bytes(model)
    predicted = None
    if layout is not None:
        config = shardcore.ShardConfig(**layout)
        with shardcore.init_empty():
            meta = build()
        report = explain(meta, config.tensor_parallel_size, ep=config.expert_parallel_size, config=config)
        predicted = report["collectives_per_step"]
        model = shardcore.optimize(model, config)
        if config.data_parallel:
            info = model.shardcore.layout
            batch = dp_part(batch, info.coordinates(dist.get_rank())["dp"], info.dp)
    experts = _expert_bytes(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, first, counted = [], None, None
    for step in range(args.warmup + args.steps):
        if layout is not None:
            dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with count_collectives() as fwd:
            out = model(**batch)
        with count_collectives() as bwd:
            out.loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        if step == 0:
            first = out.loss.detach().clone()
        if step == 1:
            counted = {"forward": dict(fwd), "backward": dict(bwd)}
    if layout is not None and counted != predicted:
        raise AssertionError(f"{name}: explain predicts {predicted}, a step issued {counted}")
    if layout is not None and layout.get("data_parallel"):
        dist.all_reduce(first)
        first /= dist.get_world_size()
    step_s = statistics.median(times)
    peak = rss_kb("VmHWM")
    return {
        "layout": name,
        "rank": dist.get_rank() if dist.is_initialized() else 0,
        "loss": first.item(),
        "step_s": slowest(step_s) if layout is not None else step_s,
        "peak_rss_mb": peak / 1024,
        "rss_increase_mb": (peak - before) / 1024,
        "state_mb": state_bytes(model, opt) / 2**20,
        "expert_fraction": experts / full_experts,
        "collectives_per_step": counted,
        "all_to_all_per_step": sum(c.get("all_to_all", 0) for c in (counted or {}).values()),
    }


def report(results: list[dict], args, out: pathlib.Path) -> None:
    ref = next(r for r in results if r["layout"] == "unsharded")
    for r in results:
        if abs(r["loss"] - ref["loss"]) > 1e-4 * abs(ref["loss"]):
            raise AssertionError(f"{r['layout']}: first loss {r['loss']:.6f} != unsharded {ref['loss']:.6f}")
    print(f"\nMixtral {CONFIG}, AdamW, global batch {args.batch} x seq {args.seq}; 2 gloo ranks x 1 thread\n")
    print(
        "| layout | step s | vs unsharded | peak RSS MB/rank (max) | its increase MB | params+AdamW MB/rank "
        "| experts/rank | all-to-all per step (= explain) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in LAYOUTS:
        rows = [r for r in results if r["layout"] == name]
        step = rows[0]["step_s"]
        print(
            f"| {name} | {step:.3f} | {step / ref['step_s']:.2f}x | {max(r['peak_rss_mb'] for r in rows):.0f} | "
            f"{max(r['rss_increase_mb'] for r in rows):.0f} | {max(r['state_mb'] for r in rows):.1f} | "
            f"{rows[0]['expert_fraction']:.3f} | {rows[0]['all_to_all_per_step']} |"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"config": CONFIG, "batch": args.batch, "seq": args.seq, "results": results}
    out.write_text(json.dumps(record, indent=2))
    print(f"\nwritten: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="bench-results/moe.json")
    args = parser.parse_args()
    from shardcore.testing import RankPool

    results = []
    for name, layout in LAYOUTS.items():  # fresh processes per layout: the peaks are the layout's own
        with RankPool(2 if layout is not None else 1, timeout_s=3600, threads=1) as pool:
            results += pool.run(worker, args, name)
        print(f"{name}: done", flush=True)
    report(results, args, pathlib.Path(args.out))


if __name__ == "__main__":
    main()
