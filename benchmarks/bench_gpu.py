"""Benchmark (not a test): Llama-3-8B-shaped layers on GPUs, shardcore TP vs PyTorch's TP vs HF's tp_plan.

    python benchmarks/bench_gpu.py [--layers 4] [--seq 2048] [--batch 1] [--tp 1 2 4 8] [--steps 10]
    python benchmarks/bench_gpu.py --tiny        # CPU, gloo, tiny shapes: the same code path

``nox -s bench-gpu`` runs it 3 times (``benchmarks/results/gpu.json``). The model: Llama-3-8B's
layer shapes (hidden 4096, intermediate 14336, 32 heads over 8 KV heads, vocabulary 128256, rope
theta 5e5) with ``--layers`` layers, random weights, bf16; attention on ``flash_attention_2`` when
``flash_attn`` is installed and the ranks run on CUDA, else SDPA. ``--tiny``: hidden 64, 2 layers,
vocabulary 512, fp32 on CPU (gloo). Each TP degree the devices allow (``--tp``, default 1, 2, 4, 8
up to the number of GPUs; 1 and 2 on CPU) runs one rank per device (NCCL on CUDA), and each
contestant on the same weights and batch:

* ``unsharded``: the plain model on one device (TP=1 only): every time and memory ratio is against it;
* ``shardcore``: ``shardcore.optimize(model, ShardConfig(tensor_parallel_size=tp))`` (defaults);
* ``pytorch_tp``: ``parallelize_module`` following ``config.base_model_tp_plan`` (PyTorch's own);
* ``hf_tp_plan``: ``from_pretrained(saved, tp_plan="auto")`` (HuggingFace's own TP; skipped at TP=1).

Per contestant: forward + backward step time (median of ``--steps`` after ``--warmup``, each the
slowest rank's), tokens/s (``batch x seq / step``: the TP group works on one batch), MFU, peak
memory per device (``torch.cuda.max_memory_allocated``; on CPU the process's peak RSS, which also
holds what the process did before) and the first loss (every contestant's must equal
shardcore's and the unsharded model's within 2e-2 relative in bf16, 1e-4 in fp32, or the run stops: a faster wrong answer is
no result). MFU = tokens/s x (6 x N + 12 x L x d x S) / (tp x peak FLOP/s): N the parameters
outside the embedding, L layers, d hidden, S sequence (PaLM's convention; causal attention counted
whole); peak: ``--peak-tflops``, else 989 TFLOP/s (H100/H200 bf16 dense) or 312 (A100), else a
measured matmul throughput of one device (labelled so). Prints a table, writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_common import slowest
from bench_llama_tp import pytorch_tp  # PyTorch's TP following base_model_tp_plan

LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
TINY |= {"vocab_size": 512, "max_position_embeddings": 256}
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
CONTESTANTS = ("unsharded", "shardcore", "pytorch_tp", "hf_tp_plan")


def config(args):
    from transformers import LlamaConfig

    shape = TINY if args.tiny else LLAMA3_8B
    cfg = LlamaConfig(**shape, num_hidden_layers=args.layers)
    cfg._attn_implementation = args.attention
    return cfg


def build(args, device: torch.device | str = "cpu"):
    """The model, initialized where it will run (a single-threaded CPU init of 2B parameters would
    spend lent GPU time waiting), from the same seed for every contestant (the device's generator is
    deterministic)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config(args)).to(args.dtype)


def make(name: str, args, tp: int, device: torch.device):
    import shardcore

    if name == "unsharded":  # the whole model on one device: the baseline every ratio is against
        return build(args, device)
    if name == "shardcore":
        return shardcore.optimize(build(args, device), shardcore.ShardConfig(tensor_parallel_size=tp))
    if name == "pytorch_tp":
        mesh = dist.device_mesh.init_device_mesh(device.type, (tp,))
        return pytorch_tp(build(args, device), mesh)
    import transformers

    try:  # transformers 5: the plan in a DistributedConfig (passing tp_plan itself is deprecated)
        plan = {"distributed_config": transformers.DistributedConfig(tp_plan="auto")}
    except AttributeError:
        plan = {"tp_plan": "auto"}
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": args.dtype}  # renamed in 5
    return transformers.LlamaForCausalLM.from_pretrained(args.saved, **dtype, **plan).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def time_steps(model, batch, args, device) -> tuple[float, float]:
    """(first loss, median step seconds over the ranks' slowest)."""
    times = []
    loss0 = None
    for i in range(args.warmup + args.steps):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        _sync(device)
        step = slowest(time.perf_counter() - start, device)
        if loss0 is None:
            loss0 = loss.detach().float().item()
        if i >= args.warmup:
            times.append(step)
    return loss0, statistics.median(times)


def peak_flops(args, device: torch.device) -> tuple[float, str]:
    if args.peak_tflops:
        return args.peak_tflops * 1e12, "--peak-tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, tflops in PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12, f"{name} bf16 dense"
    a = torch.randn(512, 512, dtype=args.dtype, device=device)
    a @ a
    _sync(device)
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ a
    _sync(device)
    return reps * 2 * 512**3 / (time.perf_counter() - start), f"measured {args.dtype} matmul on {device.type}"


def flops_per_token(cfg, seq: int) -> float:
    """6 N + 12 L d S: N the parameters outside the embedding (the LM head's included)."""
    d, f, layers, heads, kv = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
    )
    head_dim = d // heads
    per_layer = d * d * 2 + 2 * d * kv * head_dim + 3 * d * f
    n = layers * per_layer + d * cfg.vocab_size
    return 6 * n + 12 * layers * d * seq


def worker(args) -> list[dict]:
    rank, tp = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if args.cuda else torch.device("cpu")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config(args).vocab_size, (args.batch, args.seq), generator=g).to(device)
    batch = {"input_ids": ids, "labels": ids}
    peak, peak_source = peak_flops(args, device)
    per_token = flops_per_token(config(args), args.seq)
    rows = []
    for name in args.contestants:
        if (name == "hf_tp_plan" and tp == 1) or (name == "unsharded" and tp > 1):
            continue  # HF's TP needs two ranks; the unsharded model is measured once, on one device
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        model = make(name, args, tp, device)
        loss, step = time_steps(model, batch, args, device)
        tokens = args.batch * args.seq / step
        mem = torch.tensor([_peak_bytes(device)], dtype=torch.float64, device=device)
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
        row = {"tp": tp, "name": name, "step_s": step, "tokens_per_s": tokens, "loss": loss}
        row |= {"mfu": tokens * per_token / (tp * peak), "peak_mem_bytes_per_device": int(mem.item())}
        rows.append(row)
        del model
    for row in rows:
        row["peak_flops_per_device"], row["peak_source"], row["flops_per_token"] = peak, peak_source, per_token
    return rows if rank == 0 else []


def check_losses(rows: list[dict], rtol: float) -> None:
    whole = next((r["loss"] for r in rows if r["name"] == "unsharded"), None)
    for r in rows:  # every TP degree computes the unsharded model's loss
        if whole is not None and abs(r["loss"] - whole) > rtol * abs(whole):
            raise AssertionError(f"TP={r['tp']}: {r['name']} loss {r['loss']:.6f} != the unsharded model's {whole:.6f}")
    for tp in {r["tp"] for r in rows}:
        ref = next(r["loss"] for r in rows if r["tp"] == tp and r["name"] == "shardcore")
        for r in rows:
            if r["tp"] == tp and abs(r["loss"] - ref) > rtol * abs(ref):
                raise AssertionError(f"TP={tp}: {r['name']} loss {r['loss']:.6f} != shardcore's {ref:.6f}")


def report(rows: list[dict], args) -> None:
    head = rows[0]
    print(
        f"\nLlama{' (tiny)' if args.tiny else '-3-8B layers'} x {args.layers}, batch {args.batch} x seq {args.seq}, "
        f"{args.dtype}, attention {args.attention}; MFU = tokens/s x (6N + 12 L d S) / (tp x peak), "
        f"{head['flops_per_token']:.4g} FLOPs/token, peak {head['peak_flops_per_device'] / 1e12:.4g} TFLOP/s "
        f"per device ({head['peak_source']})\n"
    )
    print(
        f"{'tp':>3}  {'contestant':<12}{'step s':>9}  {'tokens/s':>10}  {'MFU':>7}  {'vs pytorch_tp':>13}  "
        f"{'vs unsharded':>12}  {'peak GiB/dev':>12}  {'mem vs unsh.':>12}  {'loss':>9}"
    )
    whole = next((x for x in rows if x["name"] == "unsharded"), None)
    for r in rows:
        r["time_vs_unsharded"] = r["step_s"] / whole["step_s"] if whole else None
        r["memory_vs_unsharded"] = (
            r["peak_mem_bytes_per_device"] / whole["peak_mem_bytes_per_device"] if whole else None
        )
        vs_whole = f"{r['time_vs_unsharded']:.3f}x" if whole else "-"
        mem_whole = f"{r['memory_vs_unsharded']:.3f}x" if whole else "-"
        torch_tp = next((x for x in rows if x["tp"] == r["tp"] and x["name"] == "pytorch_tp"), None)
        r["time_vs_pytorch_tp"] = r["step_s"] / torch_tp["step_s"] if torch_tp else None
        ratio = f"{r['time_vs_pytorch_tp']:.2f}x" if torch_tp else "-"
        print(
            f"{r['tp']:>3}  {r['name']:<12}{r['step_s']:>9.4f}  {r['tokens_per_s']:>10.1f}  {100 * r['mfu']:>6.2f}%  "
            f"{ratio:>13}  {vs_whole:>12}  {r['peak_mem_bytes_per_device'] / 2**30:>12.3f}  {mem_whole:>12}  "
            f"{r['loss']:>9.5f}"
        )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    setup = {k: v for k, v in vars(args).items() if k not in ("dtype", "saved")} | {"dtype": str(args.dtype)}
    out.write_text(json.dumps({"setup": setup, "results": rows}, indent=2))
    print(f"\nwritten: {out}")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, gloo, tiny shapes (the code path only)")
    parser.add_argument("--layers", type=int, default=None, help="default 4 (2 with --tiny)")
    parser.add_argument("--seq", type=int, default=None, help="default 2048 (32 with --tiny)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tp", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--contestants", nargs="+", default=list(CONTESTANTS), choices=CONTESTANTS)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", default="bench-results/gpu.json")
    args = parser.parse_args(argv)
    args.cuda = torch.cuda.is_available() and not args.tiny
    args.layers = args.layers or (2 if args.tiny else 4)
    args.seq = args.seq or (32 if args.tiny else 2048)
    args.dtype = torch.bfloat16 if args.cuda else torch.float32
    devices = torch.cuda.device_count() if args.cuda else 2
    args.tp = [t for t in (args.tp or [1, 2, 4, 8]) if t <= devices]
    try:
        import flash_attn  # noqa: F401

        flash = args.cuda
    except ImportError:
        flash = False
    args.attention = "flash_attention_2" if flash else "sdpa"
    return args


def main(argv=None) -> list[dict]:
    args = parse(argv)
    from shardcore.testing import RankPool

    rows = []
    with tempfile.TemporaryDirectory() as saved:
        args.saved = saved
        if "hf_tp_plan" in args.contestants:
            build(args).save_pretrained(saved)
        for tp in args.tp:
            pool = RankPool(tp, timeout_s=1800, threads=1, backend="nccl" if args.cuda else "gloo")
            try:
                rows += pool.run(worker, args)[0]
            finally:
                pool.close()
    check_losses(rows, 2e-2 if args.cuda else 1e-4)
    report(rows, args)
    return rows


if __name__ == "__main__":
    main()
