"""Benchmark (not a test): one process as one rank of a larger world, per layout: time, memory, MFU.

    python benchmarks/bench_simulate.py [--shape 8b 70b] [--seq 4096 8192] [--layouts ...] [--contestants ...]
    python benchmarks/bench_simulate.py --tiny     # CPU, tiny shapes: the same code path (the tests run it)

Each layout runs in a process of its own on torch's fake process-group backend
(:func:`shardcore.distributed.init_simulated_world`): that process is one rank of the layout's world
(8 ranks for most), holding exactly that rank's shards, activations, gradients and AdamW state at
Llama-3-8B or -70B layer shapes (``--layers`` layers, vocabulary 128256, bf16 on CUDA) and running its
real kernels; collectives complete without moving data, so the numbers it computes are not the
model's (shardcore's data checks are off there and say so). Per layout and contestant:

* ``step_s``: forward + backward of the rank's batch, one sequence (pipeline layouts:
  ``pipeline_step`` over 4 microbatches of one sequence each); ``optimizer_s``: AdamW's step. ``--runs``
  runs (3) of ``--steps`` steps (3) after ``--warmup``: each run's median, and the median (min-max) of the runs;
* memory: the bytes the rank holds in parameters, gradients and optimizer state (tensor by tensor,
  DTensors by their local shard), and on CUDA ``torch.cuda.max_memory_allocated`` / ``_reserved``;
* MFU of the rank's own work: its FLOPs (the cost model's count for its stage: 3 x the forward's 2
  per matmul weight per token, plus attention) over ``step_s`` x the device's peak;
* beside them, ``explain``'s prediction for that rank (:func:`shardcore.cost.memory_per_rank`:
  parameters, gradients, optimizer state, activations) and the communication the fake backend left
  out, priced by the cost model on :data:`NVLINK4` (8 x H100/H200 SXM, NVLink 4): the predicted whole
  step is the measured compute + optimizer + that communication, never overlapped.

Contestants: ``shardcore`` (defaults) on every layout; ``pytorch_tp`` (``parallelize_module`` along
``base_model_tp_plan``) and ``hf_tp_plan`` (``from_pretrained(tp_plan="auto")``) on the plain TP
layouts, the ones they run; ``unsharded`` (the plain model) at TP=1; and shardcore's kernels one at a
time, then all (``shardcore+flash``, ``+fused_norm``, ``+jit_fused``, ``+all``) at TP=1 and TP=8.
Writes ``--out`` (JSON) after each measurement and prints a table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_gpu import LLAMA3_8B, PEAK_TFLOPS

LLAMA3_70B = LLAMA3_8B | {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 8}
TINY |= {"vocab_size": 512, "max_position_embeddings": 256}
SHAPES = {"8b": LLAMA3_8B, "70b": LLAMA3_70B, "tiny": TINY}
MICROBATCHES = 4

#: name: (world, the cost model's layout, other ShardConfig fields, the pipeline stage this rank runs)
_SG = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "split_gather"}
LAYOUTS = {
    "tp1": (1, {}, {}, None),
    "tp2": (2, {"tp": 2}, {}, None),
    "tp4": (4, {"tp": 4}, {}, None),
    "tp8": (8, {"tp": 8}, {}, None),
    "tp8-split_gather": (8, {"tp": 8}, _SG, None),
    "tp4-ulysses2": (8, {"tp": 4, "sp": 2, "mode": "all_to_all"}, {}, None),
    "tp4-ring2": (8, {"tp": 4, "sp": 2, "mode": "ring_attn"}, {}, None),
    "tp2-pp4-first": (8, {"tp": 2, "pp": 4}, {}, 0),
    "tp2-pp4-middle": (8, {"tp": 2, "pp": 4}, {}, 1),
    "tp2-pp4-last": (8, {"tp": 2, "pp": 4}, {}, 3),
    "tp2-fsdp4": (8, {"tp": 2, "dp": 4, "data_parallel": "fsdp"}, {}, None),
    "tp2-hsdp2x2": (8, {"tp": 2, "dp": 4, "data_parallel": "hsdp", "shard": 2}, {}, None),
}
PLAIN_TP = ("tp2", "tp4", "tp8")
#: shardcore's kernels one at a time (``shardcore+NAME``), then all of them, on these layouts
KERNELS = {
    "flash": {"enable_flash_attention": True},
    "fused_norm": {"enable_fused_normalization": True},
    "jit_fused": {"enable_jit_fused": True},
    "all": {"enable_all_optimization": True},
    # the user's own lines, not a ShardConfig switch (USER_LINES): the loss without the logits,
    # selective and full activation checkpointing through the model's own gradient_checkpointing_enable
    "chunked_ce": {},
    "sac": {},
    "ac": {},
}
KERNEL_LAYOUTS = ("tp1", "tp8")
CONTESTANTS = ("unsharded", "shardcore", "pytorch_tp", "hf_tp_plan", *(f"shardcore+{k}" for k in KERNELS))

#: 8 x H100/H200 SXM over NVLink 4 and NVSwitch: 900 GB/s per GPU both ways (NVIDIA's H100 datasheet),
#: nccl-tests' all_reduce bus bandwidth 460-480 GB/s at large sizes on 8 x H100 SXM (reported, e.g.
#: docs.alayanew.com, "NCCL-tests in practice"); taken as 450 GB/s for every kind, 20 us a call
#: (an assumption: NCCL's ring latency at small sizes), in the cost model's terms (seconds = latency
#: + bytes one rank contributes / bytes_per_s; see shardcore.cost.model.collective_seconds)
BUS_BYTES_PER_S, LATENCY_S = 450e9, 20e-6


def _fits(per_contributed: callable) -> dict:
    return {str(g): {"latency_s": LATENCY_S, "bytes_per_s": per_contributed(g)} for g in (2, 4, 8)}


NVLINK4 = {
    "collectives": {
        "all_reduce": _fits(lambda g: BUS_BYTES_PER_S * g / (2 * (g - 1))),  # busbw = algbw x 2(g-1)/g
        "all_gather": _fits(lambda g: BUS_BYTES_PER_S / (g - 1)),  # a rank's c bytes: (g-1) c / busbw
        "reduce_scatter": _fits(lambda g: BUS_BYTES_PER_S * g / (g - 1)),  # a rank's S bytes: (g-1)/g S / busbw
        "all_to_all": _fits(lambda g: BUS_BYTES_PER_S * g / (g - 1)),
    },
    "per_rank": {str(g): {"send_recv": {"latency_s": LATENCY_S, "bytes_per_s": BUS_BYTES_PER_S}} for g in (2, 4, 8)},
}


def cost_layout(name: str) -> dict:
    _, given, _, _ = LAYOUTS[name]
    layout = {"dp": 1, "pp": 1, "sp": 1, "tp": 1, "ep": 1, "mode": None, "data_parallel": None} | given
    return layout | {"microbatches": MICROBATCHES if layout["pp"] > 1 else 1}


def shard_config(name: str, batch: dict | None = None, kernels: dict | None = None):
    import shardcore
    from shardcore.cost import shard_config as from_layout

    _, _, extra, _ = LAYOUTS[name]
    layout = cost_layout(name)
    base = shardcore.ShardConfig(**extra, **(kernels or {}), example_inputs=batch if layout["pp"] > 1 else None)
    return from_layout(layout, base)


def rank_of(name: str) -> int:
    """The rank this process plays: the last (a pipeline layout: the first one on its stage)."""
    from shardcore.distributed import ParallelLayout

    world, _, _, stage = LAYOUTS[name]
    if stage is None:
        return world - 1
    layout = ParallelLayout.from_config(shard_config(name), world_size=world)
    return next(r for r in range(world) if layout.coordinates(r)["pp"] == stage)


def llama_config(shape: str, layers: int, attention: str):
    from transformers import LlamaConfig

    cfg = LlamaConfig(**SHAPES[shape], num_hidden_layers=layers)
    cfg._attn_implementation = attention
    return cfg


def batch_of(name: str, cfg, seq: int, device) -> dict:
    n = MICROBATCHES if cost_layout(name)["pp"] > 1 else 1  # a pipeline: 4 microbatches of one sequence
    ids = torch.randint(0, cfg.vocab_size, (n, seq), generator=torch.Generator().manual_seed(1)).to(device)
    return {"input_ids": ids, "labels": ids}


def build(cfg, device, dtype):
    """The whole model, initialized on the device it runs on (same seed for every contestant)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(cfg).to(dtype)


def chunked_loss(model, batch: dict) -> torch.Tensor:
    """``shardcore+chunked_ce``'s loss: the head and its cross entropy a chunk of tokens at a time."""
    import shardcore

    hidden = model.model(input_ids=batch["input_ids"]).last_hidden_state
    labels = batch["labels"][:, 1:].flatten()
    return shardcore.vocab_parallel_linear_cross_entropy(hidden[:, :-1].flatten(0, 1), model.lm_head, labels)


def checkpointed(model, selective: bool):
    """``shardcore+sac`` / ``+ac``: the model's own activation checkpointing, selective or full."""
    import shardcore

    kwargs = {"use_reentrant": False}
    if selective:
        kwargs["context_fn"] = shardcore.selective_checkpoint_context()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def make(contestant: str, name: str, cfg, device, dtype, batch: dict, saved: str | None):
    import shardcore

    if contestant == "unsharded":
        return build(cfg, device, dtype)
    if contestant.startswith("shardcore"):
        kernel = contestant.partition("+")[2]
        model = shardcore.optimize(build(cfg, device, dtype), shard_config(name, batch, KERNELS.get(kernel)))
        return checkpointed(model, kernel == "sac") if kernel in ("sac", "ac") else model
    tp = cost_layout(name)["tp"]
    if contestant == "pytorch_tp":
        from bench_llama_tp import pytorch_tp

        return pytorch_tp(build(cfg, device, dtype), torch.distributed.device_mesh.init_device_mesh(device.type, (tp,)))
    import transformers

    plan = {"distributed_config": transformers.DistributedConfig(tp_plan="auto")}
    return transformers.LlamaForCausalLM.from_pretrained(saved, dtype=dtype, **plan).to(device)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def held_bytes(model, optimizer) -> dict[str, int]:
    """What the rank holds, tensor by tensor (a DTensor: its local shard)."""
    nbytes = lambda t: _local(t).numel() * _local(t).element_size()  # noqa: E731
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": sum(map(nbytes, params)),
        "gradients": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(map(nbytes, state)),
    }


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(model, optimizer, batch, pipeline: bool, args, device, loss_of=None) -> dict:
    """Per run: the median step and optimizer seconds of ``--steps`` steps; ``--runs`` runs after ``--warmup``."""
    import shardcore

    runs = []
    for r in range(args.runs + 1):
        steps, optims = [], []
        for _ in range(args.warmup if r == 0 else args.steps):
            _sync(device)
            start = time.perf_counter()
            if pipeline:
                shardcore.pipeline_step(model, batch)
            else:
                (loss_of(model, batch) if loss_of else model(**batch).loss).backward()
            _sync(device)
            mid = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=r != args.runs)  # the last run keeps its gradients (zeroed), to be counted
            _sync(device)
            steps.append(mid - start)
            optims.append(time.perf_counter() - mid)
        if r:  # run 0 is the warm-up
            runs.append((statistics.median(steps), statistics.median(optims)))
    return {"step_s_runs": [s for s, _ in runs], "optimizer_s_runs": [o for _, o in runs]}


def measure(contestant: str, name: str, args, saved: str | None) -> dict:
    """One contestant on one layout, this process as the layout's rank (the fake backend)."""
    import torch.distributed as dist

    from shardcore.distributed import init_simulated_world

    device = torch.device("cuda") if args.cuda else torch.device("cpu")
    world, rank = LAYOUTS[name][0], rank_of(name)
    init_simulated_world(rank, world)
    saved_env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    # transformers' tp_plan reads the world from torchrun's variables; every rank is this device's
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
    try:
        cfg = llama_config(args.shape, args.layers, args.attention)
        batch = batch_of(name, cfg, args.seq, device)
        if args.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        model = make(contestant, name, cfg, device, args.dtype, batch, saved)
        if args.cuda:  # the whole model was built on the device before it was cut: the rank's peak starts here
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        row = {"layout": name, "contestant": contestant, "world": world, "rank": dist.get_rank()}
        loss_of = chunked_loss if contestant == "shardcore+chunked_ce" else None
        row |= timed_steps(model, optimizer, batch, cost_layout(name)["pp"] > 1, args, device, loss_of)
        row["held_bytes"] = held_bytes(model, optimizer)
        if args.cuda:
            row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        del model, optimizer
        return row
    finally:
        dist.destroy_process_group()
        for key, value in saved_env.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def predicted(name: str, args) -> dict:
    """``explain``'s figures for the rank ``name`` simulates: its memory (the cost model's), its FLOPs,
    and the communication the fake backend leaves out, on :data:`NVLINK4` (no process group: on paper)."""
    from transformers import LlamaForCausalLM

    import shardcore
    from shardcore.cost import memory_per_rank
    from shardcore.cost.model import communication
    from shardcore.cost.search import workload_facts

    _, _, extra, stage = LAYOUTS[name]
    layout = cost_layout(name)
    with shardcore.init_empty():
        model = LlamaForCausalLM(llama_config(args.shape, args.layers, args.attention)).to(args.dtype)
    batch = (MICROBATCHES if layout["pp"] > 1 else 1) * layout["dp"]  # the global batch: one sequence a dp rank
    facts = workload_facts(model, layout, seq=args.seq, batch=batch, base=shardcore.ShardConfig(**extra))
    s = stage or 0
    comm = communication(facts, layout, NVLINK4, facts["stages"][s])
    return {
        "memory": memory_per_rank(facts, layout, "adamw", index=s),
        "communication_s": comm,
        "flops": rank_flops(facts, layout, s),
    }


def rank_flops(facts: dict, layout: dict, s: int) -> float:
    """The rank's FLOPs per step as the cost model counts them (:func:`shardcore.cost.predict`):
    3 x (2 per matmul weight per token + attention), the head on the whole sequence."""
    stage, seq = facts["stages"][s], facts["seq"]
    heads, dim, causal = facts["attention"]
    tokens = facts["batch"] // layout["dp"] * seq // layout["sp"]
    whole = facts["batch"] // layout["dp"] * seq if layout["sp"] > 1 else tokens
    attention = 4 * seq * heads * dim * (0.5 if causal else 1.0)
    body = stage.matmul_weights - stage.tail_weights
    return 3 * (tokens * (2 * body + stage.attention_layers * attention) + whole * 2 * stage.tail_weights)


def peak_flops(args) -> tuple[float, str]:
    if args.cuda:
        name = torch.cuda.get_device_name()
        for key, tflops in PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12, f"{name} bf16 dense"
    a = torch.randn(256, 256, dtype=args.dtype, device="cuda" if args.cuda else "cpu")
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ a
    _sync(a.device)
    return reps * 2 * 256**3 / (time.perf_counter() - start), f"measured {args.dtype} matmul"


def contestants(name: str, args) -> list[str]:
    def runs(c: str) -> bool:
        if c == "shardcore":
            return True
        if c == "unsharded":
            return name == "tp1"
        if c.startswith("shardcore+"):
            return name in KERNEL_LAYOUTS
        return name in PLAIN_TP  # PyTorch's TP and HF's tp_plan: the plain TP layouts

    return [c for c in args.contestants if runs(c)]


def run_all(args, rows: list[dict]) -> None:
    """Every layout and contestant of one shape and sequence length, in this process (each its own
    fake world), appended to ``rows`` and written to ``--out`` as each is done (a run stopped at a
    time limit keeps what it measured)."""
    peak, source = peak_flops(args)
    with tempfile.TemporaryDirectory() as saved:
        if "hf_tp_plan" in args.contestants:
            device = "cuda" if args.cuda else "cpu"  # initialized where it is fast
            build(llama_config(args.shape, args.layers, args.attention), device, args.dtype).save_pretrained(saved)
        for name in args.layouts:
            guess = predicted(name, args)
            for contestant in contestants(name, args):
                start = time.perf_counter()
                row = {"shape": args.shape, "seq": args.seq, **measure(contestant, name, args, saved)}
                row["predicted"] = guess if contestant.startswith("shardcore") else None
                row |= summarize(row, guess, peak)
                row["peak_flops"], row["peak_source"] = peak, source
                rows.append(row)
                print(
                    f"  {args.shape} seq {args.seq} {name} {contestant}: {time.perf_counter() - start:.1f}s", flush=True
                )
    return rows


def summarize(row: dict, guess: dict, peak: float) -> dict:
    step = statistics.median(row["step_s_runs"])
    optim = statistics.median(row["optimizer_s_runs"])
    comm = sum(guess["communication_s"].values())
    out = {"step_s": step, "optimizer_s": optim, "mfu": guess["flops"] / (step * peak)}
    out["predicted_whole_step_s"] = step + optim + comm
    out["parameter_bytes_vs_explain"] = row["held_bytes"]["parameters"] / guess["memory"]["parameters"]
    if "peak_allocated_bytes" in row:
        out["peak_vs_explain"] = row["peak_allocated_bytes"] / guess["memory"]["total"]
    return out


def _span(values: list[float], scale: float = 1.0, fmt: str = ".4f") -> str:
    return f"{statistics.median(values) * scale:{fmt}} ({min(values) * scale:{fmt}}-{max(values) * scale:{fmt}})"


def report(rows: list[dict], args) -> None:
    gib = 2**30
    print(
        f"\n{'shape':>5} {'seq':>5}  {'layout':<17}{'contestant':<22}{'step s, median (min-max)':>30}  {'optim s':>8}  "
        f"{'MFU':>6}  {'held GiB':>8}  {'params/explain':>14}  {'peak GiB':>8}  {'peak/explain':>12}  {'whole step s':>12}"
    )
    for r in rows:
        held = sum(r["held_bytes"].values()) / gib
        peak = f"{r['peak_allocated_bytes'] / gib:8.2f}" if "peak_allocated_bytes" in r else f"{'-':>8}"
        vs = f"{r['peak_vs_explain']:12.3f}" if "peak_vs_explain" in r else f"{'-':>12}"
        whole = f"{r['predicted_whole_step_s']:12.4f}" if r["predicted"] else f"{'-':>12}"
        print(
            f"{r['shape']:>5} {r['seq']:>5}  {r['layout']:<17}{r['contestant']:<22}{_span(r['step_s_runs']):>30}  "
            f"{r['optimizer_s']:8.4f}  {100 * r['mfu']:5.1f}%  {held:8.3f}  {r['parameter_bytes_vs_explain']:14.4f}  "
            f"{peak}  {vs}  {whole}"
        )
    print(f"\nwritten: {save(rows, args)}")


def save(rows: list[dict], args) -> pathlib.Path:
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    setup = {k: v for k, v in vars(args).items() if k not in ("dtype", "shape", "seq")} | {"dtype": str(args.dtype)}
    setup["interconnect"] = {"bus_bytes_per_s": BUS_BYTES_PER_S, "latency_s": LATENCY_S, "profile": NVLINK4}
    if args.cuda:
        setup["device"] = torch.cuda.get_device_name()
    setup["versions"] = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    out.write_text(json.dumps({"setup": setup, "results": rows}, indent=2, default=str))
    return out


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, tiny shapes (the code path only)")
    parser.add_argument("--shape", nargs="+", default=None, choices=("8b", "70b"), help="default 8b 70b")
    parser.add_argument("--seq", nargs="+", type=int, default=None, help="default 4096 8192 (32 with --tiny)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--contestants", nargs="+", default=list(CONTESTANTS), choices=CONTESTANTS)
    parser.add_argument("--steps", type=int, default=3, help="steps per run (each run's figure: their median)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default="bench-results/simulate.json")
    args = parser.parse_args(argv)
    args.cuda = torch.cuda.is_available() and not args.tiny
    args.shapes = ["tiny"] if args.tiny else (args.shape or ["8b", "70b"])
    args.seqs = args.seq or ([32] if args.tiny else [4096, 8192])
    args.dtype = torch.bfloat16 if args.cuda else torch.float32
    args.attention = "sdpa"
    return args


def main(argv=None) -> list[dict]:
    args = parse(argv)
    rows: list[dict] = []
    for shape in args.shapes:
        for seq in args.seqs:
            args.shape, args.seq = shape, seq
            run_all(args, rows)
    report(rows, args)
    return rows


if __name__ == "__main__":
    main()
