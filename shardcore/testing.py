"""The conformance kit: run code on N gloo ranks, and check a policy against the unsharded model.

Plugins (and third parties) test their policies with two pieces::

    from shardcore.testing import run_on_ranks, assert_sharded_matches

    def _check(tp):                        # runs on every rank
        assert_sharded_matches(build_model, make_batch(), ShardConfig(tensor_parallel_size=tp))

    def test_my_model():
        run_on_ranks(2, _check, 2)

:func:`run_on_ranks` keeps one pool of ``world_size`` worker processes per size alive for the
whole test session (spawning ranks costs seconds), each with a gloo process group. The function
must be defined at module level; it is found in the workers by module name or file path.

Tolerances of :func:`assert_sharded_matches` (fp32, dropout 0), and why:

* outputs: max abs difference <= ``atol_out`` (1e-5). Sharding changes only the order of
  floating point sums (a split matmul plus an all-reduce), a few ulps per layer.
* loss: relative difference <= ``rtol_loss`` (1e-6).
* gradients, gathered to full size: ``allclose(atol=1e-6, rtol=1e-4)``, for *every* parameter.
* parameters after ``steps`` AdamW steps: max abs difference <= ``atol_step`` (1e-5). AdamW
  runs with ``eps=1e-5`` (not 1e-8). Gradients in fp32 carry rounding noise of ~1e-8 absolute
  (a few 1e-5 of the largest gradient) in any two runs that sum in a different order, sharded
  or not; where a gradient is itself that small (a zero in exact arithmetic, such as
  attention's key bias, or a near-cancelling embedding row), Adam's ``m / (sqrt(v) + eps)``
  turns the noise into a step of up to ``lr``. With ``eps`` well above the noise floor an
  element's step differs by at most ``lr * noise / eps`` (~1e-6), while a real sharding error
  (a missed update, a doubled tied weight) still moves parameters by ~``lr`` = 1e-3.
  (Checked: the same comparison in float64 agrees to 1e-19.)
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import multiprocessing as mp
import os
import socket
import sys
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
from torch import nn

__all__ = [
    "RankError",
    "RankPool",
    "assert_lazy_load_matches",
    "assert_same_checkpoint",
    "assert_sharded_matches",
    "close_pools",
    "run_on_ranks",
]


class RankError(AssertionError):
    """A function failed on one or more ranks; the message carries each rank's traceback."""


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resolve(module_name: str, file: str | None, qualname: str) -> Callable:
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if file is None:
                raise
            spec = importlib.util.spec_from_file_location(module_name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker(rank: int, world_size: int, port: int, conn, timeout_s: float, threads: int) -> None:
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            break
        if task is None:
            break
        module_name, file, qualname, args, kwargs = task
        try:
            result = ("ok", _resolve(module_name, file, qualname)(*args, **kwargs))
        except BaseException:  # report everything, including assertion failures
            result = ("err", traceback.format_exc())
        conn.send(result)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


class RankPool:
    """``world_size`` spawned processes in one gloo process group, kept alive between calls."""

    def __init__(self, world_size: int, *, timeout_s: float = 300.0, threads: int | None = None) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        threads = threads or max(1, (os.cpu_count() or 1) // world_size)
        ctx = mp.get_context("spawn")
        port = _free_port()
        self._conns, self._procs = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, world_size, port, child, timeout_s, threads), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    @property
    def alive(self) -> bool:
        return all(p.is_alive() for p in self._procs)

    def run(self, fn: Callable, *args, **kwargs) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        Raises :class:`RankError` with every failing rank's traceback. After a failure the pool
        is closed (a rank may be stuck in a collective), and the next call gets a fresh one.
        """
        file = getattr(getattr(fn, "__code__", None), "co_filename", None)
        task = (fn.__module__, file, fn.__qualname__, args, kwargs)
        for conn in self._conns:
            conn.send(task)
        results, errors = [], []
        for rank, conn in enumerate(self._conns):
            if not conn.poll(self.timeout_s + 30):
                errors.append(f"rank {rank}: no answer within {self.timeout_s + 30:.0f} s")
                results.append(None)
                continue
            try:
                status, value = conn.recv()
            except EOFError:
                errors.append(f"rank {rank}: worker died (exit code {self._procs[rank].exitcode})")
                results.append(None)
                continue
            if status == "err":
                errors.append(f"rank {rank}:\n{value}")
            results.append(value)
        if errors:
            self.close()
            raise RankError(
                f"{fn.__qualname__} failed on {len(errors)} of {self.world_size} ranks:\n" + "\n".join(errors)
            )
        return results

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self._procs.clear()
        self._conns.clear()


_POOLS: dict[int, RankPool] = {}


def run_on_ranks(world_size: int, fn: Callable, *args, **kwargs) -> list[Any]:
    """Run module-level ``fn`` on ``world_size`` gloo ranks (a cached :class:`RankPool`)."""
    pool = _POOLS.get(world_size)
    if pool is None or not pool.alive:
        pool = _POOLS[world_size] = RankPool(world_size)
    try:
        return pool.run(fn, *args, **kwargs)
    finally:
        if not pool.alive or not pool._procs:
            _POOLS.pop(world_size, None)


@atexit.register
def close_pools() -> None:
    """Shut every cached pool down (also run at interpreter exit)."""
    while _POOLS:
        _POOLS.popitem()[1].close()


# --------------------------------------------------------------------------------------------
def _tensors(output: Any) -> dict[str, torch.Tensor]:
    """The floating-point tensors of a model output (a tensor, tuple, dict or ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return {"output": output}
    items = output.items() if isinstance(output, Mapping) else enumerate(output)
    found = {}
    for key, value in items:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            found[str(key)] = value
        elif isinstance(value, tuple | list) and value and all(isinstance(v, torch.Tensor) for v in value):
            for i, v in enumerate(value):
                if v.is_floating_point():
                    found[f"{key}.{i}"] = v
    return found


def _loss(output: Any, loss_fn: Callable | None) -> torch.Tensor:
    if loss_fn is not None:
        return loss_fn(output)
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise ValueError("the model output has no 'loss'; pass loss_fn=")
    return loss


def assert_sharded_matches(
    build: Callable[[], nn.Module],
    inputs: Mapping[str, Any],
    config=None,
    *,
    policy=None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    seed: int = 0,
    steps: int = 3,
    lr: float = 1e-3,
    adam_eps: float = 1e-5,
    atol_out: float = 1e-5,
    rtol_loss: float = 1e-6,
    grad_atol: float = 1e-6,
    grad_rtol: float = 1e-4,
    atol_step: float = 1e-5,
    skip_outputs: tuple[str, ...] = ("loss",),
    sharded_output_fn: Callable[[nn.Module, Any], Any] | None = None,
) -> dict[str, float]:
    """Check a sharded model against the unsharded one; run on every rank of the group.

    ``build()`` is called twice after ``torch.manual_seed(seed)``; one copy is sharded with
    :func:`shardcore.optimize`. Both run ``model(**inputs)``: every floating-point output must
    match, the loss (``output.loss`` or ``loss_fn(output)``) too, then every gradient (gathered)
    and every parameter after ``steps`` AdamW steps. Returns the largest differences seen.

    ``sharded_output_fn(model, output)``, if given, maps the sharded output before it is
    compared (e.g. to gather logits kept vocab-parallel by ``parallel_output=True``).
    """
    import shardcore

    torch.manual_seed(seed)
    ref = build()
    torch.manual_seed(seed)
    model = shardcore.optimize(build(), config, policy=policy)
    report = {}

    out_ref, out = ref(**inputs), model(**inputs)
    ref_t = _tensors(out_ref)
    got_t = _tensors(out if sharded_output_fn is None else sharded_output_fn(model, out))
    if set(ref_t) != set(got_t):
        raise AssertionError(f"output fields differ: unsharded {sorted(ref_t)} vs sharded {sorted(got_t)}")
    worst = 0.0
    for key, expected in ref_t.items():
        if key in skip_outputs:
            continue
        actual = got_t[key]
        if actual.shape != expected.shape:
            raise AssertionError(f"output {key!r}: shape {tuple(actual.shape)} != unsharded {tuple(expected.shape)}")
        diff = (actual - expected).abs().max().item() if expected.numel() else 0.0
        if not diff <= atol_out:
            raise AssertionError(f"output {key!r}: max abs diff {diff:.3g} > {atol_out}")
        worst = max(worst, diff)
    report["max_abs_diff_outputs"] = worst

    loss_ref, loss = _loss(out_ref, loss_fn), _loss(out, loss_fn)
    rel = abs(loss.item() - loss_ref.item()) / max(abs(loss_ref.item()), 1e-12)
    if not rel <= rtol_loss:
        raise AssertionError(
            f"loss {loss.item():.9g} vs unsharded {loss_ref.item():.9g}: relative diff {rel:.3g} > {rtol_loss}"
        )
    report["loss"], report["loss_unsharded"], report["loss_rel_diff"] = loss.item(), loss_ref.item(), rel

    loss_ref.backward()
    loss.backward()
    ref_grads = dict(ref.named_parameters())
    worst = 0.0
    seen = set()
    for name, grad in shardcore.full_named_tensors(model, grads=True):
        seen.add(name)
        expected = ref_grads[name].grad
        if (grad is None) != (expected is None):
            raise AssertionError(
                f"gradient of {name}: sharded {'None' if grad is None else 'set'}, unsharded {'None' if expected is None else 'set'}"
            )
        if grad is None:
            continue
        if grad.shape != expected.shape:
            raise AssertionError(f"gradient of {name}: shape {tuple(grad.shape)} != unsharded {tuple(expected.shape)}")
        if not torch.allclose(grad, expected, atol=grad_atol, rtol=grad_rtol):
            diff = (grad - expected).abs().max().item()
            raise AssertionError(f"gradient of {name}: max abs diff {diff:.3g} (atol {grad_atol}, rtol {grad_rtol})")
        worst = max(worst, (grad - expected).abs().max().item())
    if seen != set(ref_grads):
        raise AssertionError(
            f"parameters differ: missing {sorted(set(ref_grads) - seen)}, extra {sorted(seen - set(ref_grads))}"
        )
    report["max_abs_diff_grads"] = worst

    if steps:
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=lr, eps=adam_eps)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=adam_eps)
        for step in range(steps):
            if step:
                for m, o in ((ref, opt_ref), (model, opt)):
                    o.zero_grad()
                    _loss(m(**inputs), loss_fn).backward()
            opt_ref.step()
            opt.step()
        ref_params = dict(ref.named_parameters())
        worst = 0.0
        for name, full in shardcore.full_named_tensors(model):
            diff = (full - ref_params[name].detach()).abs().max().item()
            if not diff <= atol_step:
                raise AssertionError(
                    f"parameter {name} after {steps} AdamW steps: max abs diff {diff:.3g} > {atol_step}"
                )
            worst = max(worst, diff)
        report["max_abs_diff_after_steps"] = worst
    return report


# --------------------------------------------------------------------------------------------
def assert_lazy_load_matches(
    build: Callable[[], nn.Module],
    inputs: Mapping[str, Any],
    checkpoint: str,
    config=None,
    *,
    save_to: str | None = None,
    seed: int = 0,
    atol: float = 1e-6,
    policy=None,
) -> float:
    """Build the model on the meta device, shard it, load ``checkpoint`` into it and compare its
    outputs with ``build()`` (seeded with ``seed``; the checkpoint must hold that model's weights)
    within ``atol``. With ``save_to``, then write it back with :func:`shardcore.save_checkpoint`
    (compare the directories with :func:`assert_same_checkpoint`). Run on every rank."""
    import shardcore

    torch.manual_seed(seed)
    ref = build().eval()
    with torch.device("meta"):
        model = build()
    model = shardcore.optimize(model.eval(), config, policy=policy)
    shardcore.load_checkpoint(model, checkpoint)
    with torch.no_grad():
        expected, actual = _tensors(ref(**inputs)), _tensors(model(**inputs))
    worst = 0.0
    for key, want in expected.items():
        diff = (actual[key] - want).abs().max().item() if want.numel() else 0.0
        if not diff <= atol:
            raise AssertionError(f"output {key!r} after lazy load: max abs diff {diff:.3g} > {atol}")
        worst = max(worst, diff)
    if save_to is not None:
        shardcore.save_checkpoint(model, save_to)
    return worst


def assert_same_checkpoint(reference: str, written: str) -> None:
    """Every tensor of the safetensors checkpoint ``reference`` is bit-identical in ``written``."""
    from pathlib import Path

    from safetensors.torch import load_file

    def tensors(directory: str) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for file in sorted(Path(directory).glob("*.safetensors")):
            out.update(load_file(str(file)))
        return out

    want, got = tensors(reference), tensors(written)
    missing = sorted(set(want) - set(got))
    if missing:
        raise AssertionError(f"{written} lacks tensors {missing}")
    for name, tensor in want.items():
        if got[name].shape != tensor.shape or not torch.equal(got[name], tensor):
            raise AssertionError(f"tensor {name!r} differs after the save_checkpoint round trip")
