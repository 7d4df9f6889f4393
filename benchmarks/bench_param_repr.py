"""Benchmark (not a test): the parameter-representation prototype, plain local shards vs DTensor
parameters, on ``nox -s bench``'s Llama at TP=2 (issue 45's decision; docs/parameters.md).

    python benchmarks/bench_param_repr.py [--seq 256] [--steps 10] [--warmup 2]

Both contestants are ``shardcore.optimize`` of the same Llama with the same weights, on 2 gloo
ranks x 1 thread, and take turns one step each per round:

* ``plain`` (today): every parameter a plain tensor holding this rank's slice (its layout in a
  ``ShardSpec``); ``torch.nn.utils.clip_grad_norm_`` is right through the mark its gradients carry
  (``shardcore/grad_mark.py``);
* ``unmarked``: the same, its gradients without the mark (``grad_mark.unmark``), clipped by
  ``shardcore.clip_grad_norm_(model, c)``: what the mark costs (a hook per parameter per backward,
  a dispatch per optimizer operation on a gradient);
* ``dtensor`` (the prototype): the same model, then every parameter replaced by a DTensor
  parameter on the tensor-parallel mesh (``Shard(d)`` where the slice is an even split along
  ``d``, ``Replicate()`` for the rest), the layers reading the local tensor through a
  ``torch.nn.utils.parametrize`` parametrization (``to_local()``: no DTensor dispatch in the
  forward's matmuls, shardcore's own collectives unchanged); the gradient norm is torch's own over
  DTensor gradients (the model's gradients carry no mark, and it is not registered with shardcore).

Per contestant: forward + backward (what ``nox -s bench`` times), ``clip_grad_norm_``, the AdamW
step, and the whole training step, each the median over ``--steps`` of the slower rank; the
first loss and the first gradient norm must equal the unsharded model's (relative 1e-4), or the run stops. Prints a
table and writes ``--out``; ``nox -s bench-param-repr`` runs it 3 times (benchmarks/repeat.py).
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
from bench_llama_tp import BATCH, CONFIG, build

PARTS = ("fwd_bwd", "clip", "optimizer", "step")
DEVICE = ["cpu"]  # where the ranks compute: "cuda" with --cuda


class _Local(torch.nn.Module):
    """The parametrization: the layer computes on the DTensor parameter's local tensor."""

    def forward(self, x):
        return x.to_local()


def to_dtensor_parameters(model: torch.nn.Module, full: torch.nn.Module, mesh) -> dict[str, int]:
    """Replace each parameter of the sharded ``model`` by a DTensor parameter on ``mesh``: ``Shard(d)``
    where its shape is ``full``'s with dimension ``d`` divided by the mesh size, else ``Replicate()``.
    Returns how many of each."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.nn.utils import parametrize

    whole = dict(full.named_parameters())
    counts = {"Shard": 0, "Replicate": 0}
    size = mesh.size()
    for name, p in list(model.named_parameters()):
        shape, ref = tuple(p.shape), tuple(whole[name].shape)
        dims = [
            d
            for d in range(len(ref))
            if shape[d] * size == ref[d] and shape[:d] + shape[d + 1 :] == ref[:d] + ref[d + 1 :]
        ]
        if shape != ref and not dims:
            raise ValueError(f"{name}: slice {shape} of {ref} is not one placement (the prototype covers even splits)")
        placement = Shard(dims[0]) if shape != ref else Replicate()
        counts[type(placement).__name__] += 1
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        dt = DTensor.from_local(p.detach(), mesh, [placement], run_check=False)
        owner._parameters[attr] = torch.nn.Parameter(dt, requires_grad=p.requires_grad)
        parametrize.register_parametrization(owner, attr, _Local(), unsafe=True)
    return counts


def _sync() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _timed(fn) -> float:
    dist.barrier()
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return slowest(time.perf_counter() - start, DEVICE[0])  # a step ends when its slower rank does


def _clip(model) -> torch.Tensor:
    import shardcore

    if getattr(model, "_unmarked", False):
        return shardcore.clip_grad_norm_(model, 1.0)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def _step(model, opt, batch) -> dict[str, float]:
    parts = {}
    parts["fwd_bwd"] = _timed(lambda: model(**batch).loss.backward())
    parts["clip"] = _timed(lambda: _clip(model))
    parts["optimizer"] = _timed(opt.step)
    opt.zero_grad(set_to_none=True)
    parts["step"] = parts["fwd_bwd"] + parts["clip"] + parts["optimizer"]
    return parts


def worker(args) -> list[dict]:
    import shardcore
    from shardcore import grad_mark, grad_norm

    torch.set_num_threads(1)
    world = dist.get_world_size()
    DEVICE[0] = device = f"cuda:{torch.cuda.current_device()}" if args.cuda else "cpu"
    g = torch.Generator().manual_seed(args.seq)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, args.seq), generator=g).to(device)
    batch = {"input_ids": ids, "labels": ids}
    config = shardcore.ShardConfig(tensor_parallel_size=world)
    models = {"plain": shardcore.optimize(build().to(device), config)}
    models["unmarked"] = shardcore.optimize(build().to(device), config)
    grad_mark.unmark(models["unmarked"])
    models["unmarked"]._unmarked = True
    prototype = shardcore.optimize(build().to(device), config)
    grad_norm._MODELS.discard(prototype)  # torch's own norm over DTensor gradients, not shardcore's
    grad_mark.unmark(prototype)
    with torch.device("meta"):
        full = build()
    mesh = dist.device_mesh.init_device_mesh(torch.device(device).type, (world,))
    placements = to_dtensor_parameters(prototype, full, mesh)
    models["dtensor"] = prototype
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    first = {}
    for name, model in models.items():  # the same loss and gradient norm, or no result
        loss = model(**batch).loss
        loss.backward()
        norm = _clip(model)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        first[name] = (loss.item(), norm.item())
        model.zero_grad(set_to_none=True)
    reference = build().to(device)  # the unsharded model: what both must compute
    loss = reference(**batch).loss
    loss.backward()
    first["unsharded"] = (loss.item(), torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0).item())
    del reference
    for name in models:
        for what, i in (("loss", 0), ("gradient norm", 1)):
            a, b = first["unsharded"][i], first[name][i]
            if abs(a - b) > 1e-4 * abs(a):  # fp32 sums in another order (as bench_llama_tp)
                raise AssertionError(f"{name}: the first {what} {b:.7f} != the unsharded model's {a:.7f}")
    times = {name: {p: [] for p in PARTS} for name in models}
    for i in range(args.warmup + args.steps):
        for name, model in models.items():
            parts = _step(model, opts[name], batch)
            if i >= args.warmup:
                for p in PARTS:
                    times[name][p].append(parts[p])
    rows = []
    for name in models:
        row = {"name": name, "seq": args.seq, "loss": first[name][0], "grad_norm": first[name][1]}
        row |= {f"{p}_s": statistics.median(times[name][p]) for p in PARTS}
        rows.append(row)
    plain = rows[0]
    for row in rows:
        row |= {f"{p}_vs_plain": row[f"{p}_s"] / plain[f"{p}_s"] for p in PARTS}
    rows[-1]["placements"] = placements
    return rows if dist.get_rank() == 0 else []


def report(rows: list[dict], args) -> None:
    where = "TP=1 on one GPU (fp32)" if args.cuda else "TP=2 on 2 gloo ranks x 1 thread"
    print(f"\nLlama {CONFIG}, batch {BATCH} x seq {args.seq}; {where}")
    print(f"DTensor parameters: {rows[-1]['placements']}\n")
    print(f"{'contestant':<10}" + "".join(f"{p + ' s':>14}{'vs plain':>10}" for p in PARTS) + f"{'grad norm':>12}")
    for r in rows:
        cells = "".join(f"{r[p + '_s']:>14.4f}{r[p + '_vs_plain']:>9.3f}x" for p in PARTS)
        print(f"{r['name']:<10}{cells}{r['grad_norm']:>12.6f}")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"setup": vars(args), "results": rows}, indent=2))
    print(f"\nwritten: {out}")


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--cuda", action="store_true", help="one rank on the GPU (TP=1: the DTensor dispatch cost alone)"
    )
    parser.add_argument("--out", default="bench-results/param_repr.json")
    args = parser.parse_args(argv)
    from shardcore.testing import RankPool

    pool = (
        RankPool(1, timeout_s=1800, threads=1, backend="nccl") if args.cuda else RankPool(2, timeout_s=1800, threads=1)
    )
    try:
        rows = pool.run(worker, args)[0]
    finally:
        pool.close()
    report(rows, args)
    return rows


if __name__ == "__main__":
    main()
