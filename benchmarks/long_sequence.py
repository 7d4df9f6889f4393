"""Demonstration (not a test): a sequence one process cannot train under a memory cap, trained
with context parallelism over 4 ranks under the same cap per rank.

    python benchmarks/long_sequence.py [--seq 32768] [--cap-mb 900] [--steps 3] [--out benchmarks/results/long_sequence.json]

A small Llama (``CONFIG``, causal, no padding) trains with AdamW on one batch of ``--seq`` random
tokens:

1. **unsharded, capped**: one process whose data size (``RLIMIT_DATA``: the heap and every private
   writable mapping, which is where PyTorch's CPU tensors live) may grow by at most ``--cap-mb``
   above what it holds once its process groups exist and the model is built on the meta device
   (weights, gradients, optimizer state and activations all under the cap); its first training step must
   fail for want of memory, or the demonstration stops (the cap proves nothing);
2. **unsharded, uncapped**: the reference losses of ``--steps`` steps (this machine has the memory;
   the cap is the demonstration's);
3. **SP=4 ring_attn, capped**: ``ShardConfig(sequence_parallel_size=4, sequence_parallelism_mode=
   "ring_attn")`` on 4 gloo ranks, each under the same cap: every step's loss must equal the
   reference's (relative 1e-4) or the run stops.

Reported per run: the cap, the outcome, each step's loss, the step time and the peak of the
resident size above the start (``VmHWM``) per rank. Writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import sys
import tempfile
import time

os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # freed tensors leave the process
import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_common import rss_kb

CONFIG = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
}
SP4 = {
    "tensor_parallel_size": 1,
    "sequence_parallel_size": 4,
    "enable_sequence_parallelism": True,
    "sequence_parallelism_mode": "ring_attn",
}


def build(seq: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**CONFIG, max_position_embeddings=seq)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def cap_data(cap_mb: int | None) -> int:
    """Limit this process's data size to what it holds now plus ``cap_mb``; the limit in bytes."""
    now = rss_kb("VmData") * 1024
    if cap_mb is None:
        return 0
    limit = now + cap_mb * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    return limit


def worker(args, checkpoint: str, layout: dict | None, cap_mb: int | None) -> dict:
    import gc

    import shardcore

    torch.set_num_threads(1)
    rank = dist.get_rank()
    gc.collect()
    dist.barrier()
    active = layout is not None or rank == 0
    if not active:  # the unsharded runs use rank 0 only
        return {}
    with shardcore.init_empty():  # no tensor allocated yet
        model = build(args.seq)
    if layout is not None:  # its process groups (and their threads) made before the cap
        model = shardcore.optimize(model, shardcore.ShardConfig(**layout))
    saved = resource.getrlimit(resource.RLIMIT_DATA)
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # the peak from here
    start_rss = rss_kb("VmRSS")
    cap_data(cap_mb)
    report = {"rank": rank, "cap_mb": cap_mb, "losses": [], "step_s": []}
    phase = "loading the checkpoint"
    try:
        shardcore.load_checkpoint(model, checkpoint)
        phase = "making the optimizer"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(args.seq)
        ids = torch.randint(0, CONFIG["vocab_size"], (1, args.seq), generator=g)
        for step in range(args.steps):
            phase = f"training step {step + 1}"
            opt.zero_grad(set_to_none=True)
            begin = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            report["step_s"].append(time.perf_counter() - begin)
            report["losses"].append(loss.item())
            del loss
        report["outcome"] = "trained"
    except (RuntimeError, MemoryError) as err:  # out of memory under the cap
        if cap_mb is None or layout is not None or "memory" not in str(err).lower():
            raise  # a sharded rank out of memory fails the run (its peers' next collective is bounded)
        report["outcome"] = f"out of memory in {phase}: {str(err).splitlines()[0][:160]}"
        report["phase"] = phase
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, saved)
    report["peak_mb"] = (rss_kb("VmHWM") - start_rss) / 1024
    return report


def run(args, checkpoint: str, ranks: int, layout: dict | None, cap_mb: int | None) -> list[dict]:
    from shardcore.testing import RankPool

    pool = RankPool(ranks, timeout_s=7200, threads=1)
    try:
        return [r for r in pool.run(worker, args, checkpoint, layout, cap_mb) if r]
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--cap-mb", type=int, default=900)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/long_sequence.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        build(args.seq).save_pretrained(tmp)
        capped = run(args, tmp, 1, None, args.cap_mb)[0]
        print(f"unsharded, data capped at +{args.cap_mb} MB: {capped['outcome']} (peak {capped['peak_mb']:.0f} MB)")
        if capped.get("phase") != "training step 1":
            raise SystemExit(
                f"the unsharded model under {args.cap_mb} MB: {capped['outcome']}; the demonstration needs its first "
                "training step to run out of memory (raise --seq or lower --cap-mb; or raise --cap-mb if it failed "
                "before training)"
            )
        reference = run(args, tmp, 1, None, None)[0]
        print(f"unsharded, uncapped: losses {reference['losses']}, peak {reference['peak_mb']:.0f} MB")
        sharded = run(args, tmp, 4, SP4, args.cap_mb)
    for r in sharded:
        print(
            f"SP=4 ring_attn rank {r['rank']}, data capped at +{args.cap_mb} MB: {r['outcome']}, "
            f"losses {r['losses']}, peak {r['peak_mb']:.0f} MB, step {min(r['step_s']):.1f} s (fastest)"
        )
        if r["outcome"] != "trained":
            raise SystemExit(f"rank {r['rank']} did not train under the cap")
        for got, want in zip(r["losses"], reference["losses"], strict=True):
            if abs(got - want) > 1e-4 * abs(want):
                raise SystemExit(f"rank {r['rank']}: loss {got} != unsharded {want}")
    record = {
        "config": CONFIG,
        "seq": args.seq,
        "cap_mb": args.cap_mb,
        "cap": "RLIMIT_DATA: the data size once the process groups exist and the model is on meta, plus cap_mb",
        "unsharded_capped": capped,
        "unsharded_reference": reference,
        "sp4_ring_attn": sharded,
        "machine": f"{os.cpu_count()} CPUs, 4 processes x 1 thread",
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"losses equal (relative 1e-4) on every rank; written: {out}")


if __name__ == "__main__":
    main()
