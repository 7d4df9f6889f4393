"""Benchmark (not a test): shardcore TP=2 vs PyTorch's own TP=2 vs the unsharded Llama.

    python benchmarks/bench_llama_tp.py [--seqs 256 1024] [--steps 10] [--warmup 2]

Starts 2 gloo ranks (1 thread each) on this machine. Measures forward+backward step time
(median of ``--steps`` after ``--warmup``; the sharded contestants take turns, one step each per
round, so that the machine's drift over the run hits them alike), parameter bytes per rank and collectives per forward
and per forward+backward (counted by PyTorch's CommDebugMode, for every contestant alike) of:

* ``unsharded``: the whole model in one process with 2 threads (the other rank idles);
* ``pytorch_tp``: ``parallelize_module`` following the model's ``config.base_model_tp_plan``
  (attention and MLP column/row parallel; embeddings and LM head replicated);
* ``pytorch_tp_vocab``: the same plus a vocab-parallel embedding (``RowwiseParallel``) and LM
  head (``ColwiseParallel`` gathering full logits), as torchtitan shards them: the baseline with
  shardcore's memory layout;
* ``shardcore``: ``shardcore.optimize`` with defaults (full-vocab logits, HF loss);
* ``shardcore_vocab_loss``: ``ShardConfig(parallel_output=True)``: logits stay vocab-split and
  the loss is the vocab-parallel cross entropy.

Every contestant's loss on the first batch must agree with the unsharded loss (relative 1e-4),
or the run stops: a faster wrong answer is no result. Prints a table and writes
``bench-results/llama_tp.json``. Times are reported as ratios to the
unsharded model and to PyTorch's TP in the same run: this machine is noisy, ratios less so.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch
import torch.distributed as dist

CONFIG = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 8192,
    "max_position_embeddings": 2048,
}
BATCH = 4


def build():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**CONFIG)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def pytorch_tp(model, mesh, vocab_parallel: bool = False):
    """PyTorch's tensor parallel, following ``config.base_model_tp_plan`` (``*`` = every layer);
    with ``vocab_parallel`` the embedding and LM head are split over the vocabulary too."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {}
    for pattern, style in model.config.base_model_tp_plan.items():
        for i in range(model.config.num_hidden_layers):
            plan["model." + pattern.replace("*", str(i))] = styles[style]()
    if vocab_parallel:
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())  # full logits, as shardcore's default
    return parallelize_module(model, mesh, plan)


def first_loss(model, batch) -> float:
    with torch.no_grad():
        return model(**batch).loss.item()


def param_bytes(model) -> int:
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def count_comms(model, batch) -> tuple[int, int]:
    import warnings

    from torch.distributed.tensor.debug import CommDebugMode

    with warnings.catch_warnings():  # its module tracker warns of every module returning a ModelOutput
        warnings.filterwarnings("ignore", message="For backward hooks to be called")
        with CommDebugMode() as fwd:
            loss = model(**batch).loss
        with CommDebugMode() as bwd:
            loss.backward()
    model.zero_grad(set_to_none=True)
    return fwd.get_total_counts(), fwd.get_total_counts() + bwd.get_total_counts()


def time_steps(model, batch, warmup: int, steps: int) -> float:
    times = []
    for i in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(**batch).loss.backward()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(args) -> list[dict]:
    """Runs on both ranks of a :class:`shardcore.testing.RankPool`; rank 0 returns the results."""
    import shardcore

    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for seq in args.seqs:
        g = torch.Generator().manual_seed(seq)
        ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, seq), generator=g)
        batch = {"input_ids": ids, "labels": ids}

        # unsharded: one process, 2 threads, while the other rank waits
        reference = torch.zeros(1, dtype=torch.float64)
        if rank == 0:
            torch.set_num_threads(world)
            model = build()
            reference[0] = first_loss(model, batch)
            fwd, total = count_comms(model, batch)
            results.append(
                {
                    "seq": seq,
                    "name": "unsharded",
                    "step_s": time_steps(model, batch, args.warmup, args.steps),
                    "param_bytes": param_bytes(model),
                    "collectives_fwd": fwd,
                    "collectives_fwd_bwd": total,
                    "loss": reference.item(),
                }
            )
            del model
        dist.broadcast(reference, 0)
        torch.set_num_threads(1)

        contestants = {
            "pytorch_tp": lambda: pytorch_tp(build(), dist.device_mesh.init_device_mesh("cpu", (world,))),
            "pytorch_tp_vocab": lambda: pytorch_tp(
                build(), dist.device_mesh.init_device_mesh("cpu", (world,)), vocab_parallel=True
            ),
            "shardcore": lambda: shardcore.optimize(build(), shardcore.ShardConfig(tensor_parallel_size=world)),
            "shardcore_vocab_loss": lambda: shardcore.optimize(
                build(), shardcore.ShardConfig(tensor_parallel_size=world, parallel_output=True)
            ),
        }
        models, counts = {}, {}
        for name, make in contestants.items():
            model = make()
            loss = first_loss(model, batch)
            if abs(loss - reference.item()) > 1e-4 * abs(reference.item()):
                raise AssertionError(f"seq {seq}: {name} loss {loss:.6f} != unsharded {reference.item():.6f}")
            models[name], counts[name] = model, (loss, *count_comms(model, batch))
        # the contestants take turns, one step each per round: the machine's drift hits them alike
        times = {name: [] for name in models}
        for i in range(args.warmup + args.steps):
            for name, model in models.items():
                model.zero_grad(set_to_none=True)
                dist.barrier()
                start = time.perf_counter()
                model(**batch).loss.backward()
                step = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(step, op=dist.ReduceOp.MAX)  # a TP step ends when its slowest rank does
                if i >= args.warmup:
                    times[name].append(step.item())
        for name, model in models.items():
            loss, fwd, total = counts[name]
            if rank == 0:
                results.append(
                    {
                        "seq": seq,
                        "name": name,
                        "step_s": statistics.median(times[name]),
                        "param_bytes": param_bytes(model),
                        "collectives_fwd": fwd,
                        "collectives_fwd_bwd": total,
                        "loss": loss,
                    }
                )
        del models, model
    return results


def report(results: list[dict], out: pathlib.Path) -> None:
    print(f"\nLlama {CONFIG}, batch {BATCH}; TP=2 on 2 gloo ranks x 1 thread, unsharded on 1 process x 2 threads\n")
    header = (
        f"{'seq':>5}  {'contestant':<22}{'step s':>8}  {'vs unsharded':>12}  {'vs pytorch_tp':>13}  {'vs pt_tp_vocab':>14}  "
        f"{'param bytes/rank':>16}  {'vs unsharded':>12}  {'coll. fwd':>9}  {'coll. fwd+bwd':>13}  {'loss':>9}"
    )
    print(header)
    for seq in sorted({r["seq"] for r in results}):
        rows = {r["name"]: r for r in results if r["seq"] == seq}
        base, torch_tp, torch_vocab = rows["unsharded"], rows["pytorch_tp"], rows["pytorch_tp_vocab"]
        for r in rows.values():
            r["time_vs_unsharded"] = r["step_s"] / base["step_s"]
            r["time_vs_pytorch_tp"] = r["step_s"] / torch_tp["step_s"]
            r["time_vs_pytorch_tp_vocab"] = r["step_s"] / torch_vocab["step_s"]
            r["param_bytes_vs_unsharded"] = r["param_bytes"] / base["param_bytes"]
            print(
                f"{seq:>5}  {r['name']:<22}{r['step_s']:>8.3f}  {r['time_vs_unsharded']:>11.2f}x  "
                f"{r['time_vs_pytorch_tp']:>12.2f}x  {r['time_vs_pytorch_tp_vocab']:>13.2f}x  {r['param_bytes']:>16,}  {r['param_bytes_vs_unsharded']:>11.3f}x  "
                f"{r['collectives_fwd']:>9}  {r['collectives_fwd_bwd']:>13}  {r['loss']:>9.5f}"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": CONFIG, "batch": BATCH, "results": results}, indent=2))
    print(f"\nwritten: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="bench-results/llama_tp.json")
    args = parser.parse_args()
    from shardcore.testing import RankPool

    pool = RankPool(2, timeout_s=3600, threads=1)
    try:
        results = pool.run(worker, args)[0]
    finally:
        pool.close()
    report(results, pathlib.Path(args.out))


if __name__ == "__main__":
    main()
