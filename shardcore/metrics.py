"""What a training run shows: tokens/s, MFU, step time, peak memory per rank and the loss, every
``log_every`` steps, to stdout and to TensorBoard, W&B or any callable (:class:`StepMetrics`).

In the loop::

    metrics = shardcore.StepMetrics(model, log_every=10, sinks=[shardcore.metrics.tensorboard("runs/a")])
    for batch in loader:
        loss = model(**batch).loss
        loss.backward(); opt.step(); opt.zero_grad()
        metrics.step(loss, tokens=batch["input_ids"].numel())   # this rank's tokens this step

Between log steps :meth:`StepMetrics.step` only adds on the device (the loss, detached) and reads the
host clock: no host sync, no collective. At a log step one ``all_gather`` over the world of five
numbers per rank (tokens, loss sum, losses counted, steps, peak memory) and one read of it on the
host give:

* ``tokens_per_s``: the job's tokens (each data-parallel part counted once: the tensor-, sequence- and
  pipeline-parallel ranks of a part report the same tokens) over the window's wall time, which the
  read at the end of the window makes exact on a GPU too (the host waited for the steps);
* ``step_s``: the window's wall time per step; ``loss``: the mean of the ranks' losses (the ranks that
  computed one: a pipeline's last stage);
* ``mfu``: ``tokens_per_s x flops_per_token / (world x peak_flops)``: ``flops_per_token`` defaults to
  6 x the unsharded model's parameters outside embeddings (a dense training step: forward 2, backward 4
  FLOPs per weight per token; attention's sequence-dependent FLOPs are not counted, and a mixture of
  experts counts every expert: pass ``flops_per_token`` for either), ``peak_flops`` to the device's
  dense bf16 peak in :data:`PEAK_FLOPS` (stated, overridable; none on a CPU: no MFU unless given);
* ``peak_memory_gb`` (the largest rank's) and ``peak_memory_gb_rank<r>``: ``torch.cuda.max_memory_allocated``
  on a GPU, the process's peak resident set on a CPU.

Sinks run on rank 0 only: ``print`` (``stdout=True``), :func:`tensorboard`, :func:`wandb` (the run the
caller started, ``wandb.init``; offline mode works), :func:`mlflow` (the active run, ``mlflow.start_run``),
or any ``fn(metrics: dict, step: int)``.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from .distributed.collectives import all_gather_cat
from .sharded_state import parameter_specs

__all__ = ["PEAK_FLOPS", "StepMetrics", "mlflow", "model_flops_per_token", "tensorboard", "wandb"]

#: dense bf16 peak FLOP/s by a substring of ``torch.cuda.get_device_name()`` (vendors' data sheets, SXM / OAM)
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "MI300X": 1307e12, "MI250X": 383e12}


def _full_numel(model: nn.Module) -> int:
    """This rank's parameters outside embeddings (a tied head's weight counted), at their unsharded sizes (a split parameter's
    whole, an FSDP shard's TP slice whole: DTensor shapes are global)."""
    specs = parameter_specs(model)

    def lookup(m: nn.Module) -> bool:  # an embedding (a vocabulary-parallel one too): looked up, no FLOPs
        return isinstance(m, nn.Embedding) or ("Embedding" in type(m).__name__ and not any(m.children()))

    weights = [(lookup(m), id(w)) for m in model.modules() if isinstance(w := getattr(m, "weight", None), torch.Tensor)]
    embeddings = {w for looked_up, w in weights if looked_up} - {w for looked_up, w in weights if not looked_up}
    total = 0
    for name, param in model.named_parameters():
        if id(param) in embeddings:
            continue
        numel, spec = param.numel(), specs.get(name, (None,))[0]
        total += numel if spec is None else numel // param.shape[spec.dim] * spec.full_size
    return total


def model_flops_per_token(model: nn.Module) -> float:
    """6 x the unsharded model's parameters outside embeddings (collective over the pipeline stages
    when there are several: each stage counts its own)."""
    count = torch.tensor([float(_full_numel(model))], device=_device(model))
    info = getattr(model, "shardcore", None)
    if info is not None and info.layout.pp > 1:
        count = all_gather_cat(count, info.layout.group("pp"), 0, where="metrics: parameters per stage").sum(
            0, keepdim=True
        )
    return 6.0 * float(count.item())


def _device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    device = torch.device("cpu") if param is None else param.device
    return device if device.type != "meta" else torch.device("cpu")


def _peak_memory(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale)


def _device_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)


class StepMetrics:
    """Per-step numbers of a training loop on every rank, logged every ``log_every`` steps (see the module).

    Args:
        model: the model :func:`shardcore.optimize` returned (or any model: then each rank is its own part).
        log_every: steps per window; :meth:`step` returns the window's metrics at its last step, else ``None``.
        sinks: callables ``fn(metrics, step)`` run on rank 0 (:func:`tensorboard`, :func:`wandb`).
        stdout: print one line per window on rank 0.
        peak_flops: the device's peak FLOP/s (default :data:`PEAK_FLOPS`' entry for it; none on a CPU).
        flops_per_token: the model's training FLOPs per token (default :func:`model_flops_per_token`).
        total: steps the run will take: a progress bar (tqdm) on rank 0, the window's numbers beside it.

    Made on every rank (with pipeline stages, counting the model's parameters is collective over them).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        log_every: int = 10,
        sinks: list[Callable[[dict, int], None]] | tuple = (),
        stdout: bool = True,
        peak_flops: float | None = None,
        flops_per_token: float | None = None,
        total: int | None = None,
    ) -> None:
        if log_every < 1:
            raise ValueError(f"StepMetrics(log_every={log_every}): give a number of steps >= 1")
        self.device, self.log_every, self.sinks, self.stdout = _device(model), log_every, list(sinks), stdout
        self.flops_per_token = model_flops_per_token(model) if flops_per_token is None else float(flops_per_token)
        self.peak_flops = _device_peak(self.device) if peak_flops is None else float(peak_flops)
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        info = getattr(model, "shardcore", None)
        self.parts = info.layout.dp if info is not None else self.world  # data-parallel parts of the batch
        self.steps, self.last = 0, None
        self._bar = None
        if total is not None and self.rank == 0:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                raise ImportError("StepMetrics(total=...) shows a tqdm progress bar: pip install tqdm") from None
            self._bar = tqdm(total=total, desc="training", unit="step")
        self._start_window()

    def _start_window(self) -> None:
        self._tokens, self._window, self._losses = 0, 0, 0
        self._loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._start = time.perf_counter()

    def step(self, loss: torch.Tensor | None = None, tokens: int = 0) -> dict | None:
        """One optimizer step done: its ``loss`` (this rank's, if it has one) and this rank's ``tokens``.
        No host sync and no collective but at a window's last step (:meth:`flush`)."""
        self.steps, self._window, self._tokens = self.steps + 1, self._window + 1, self._tokens + int(tokens)
        if loss is not None:
            self._loss += loss.detach().to(torch.float64)
            self._losses += 1
        if self._bar is not None:
            self._bar.update(1)
        return self.flush() if self._window == self.log_every else None

    def flush(self) -> dict | None:
        """The window's metrics now (collective: every rank calls it, as :meth:`step` does at a window's end)."""
        if self._window == 0:
            return None
        numbers = [float(self._tokens), float(self._losses), float(self._window), _peak_memory(self.device)]
        mine = torch.cat([torch.tensor(numbers, dtype=torch.float64, device=self.device), self._loss.reshape(1)])
        rows = (
            all_gather_cat(mine[None], dist.group.WORLD, 0, where="metrics: the window")
            if self.world > 1
            else mine[None]
        )
        rows = rows.tolist()  # the one host read: the window's steps are done when it returns
        seconds = time.perf_counter() - self._start
        metrics = self._metrics(rows, seconds)
        self.last = metrics
        if self.rank == 0:
            self._report(metrics)
        self._start_window()
        return metrics

    def _metrics(self, rows: list[list[float]], seconds: float) -> dict:
        tokens = sum(r[0] for r in rows) / (self.world / self.parts)  # each part's tokens once
        losses = sum(r[1] for r in rows)
        out = {"tokens_per_s": tokens / seconds, "step_s": seconds / rows[0][2]}
        if losses:
            out["loss"] = sum(r[4] for r in rows) / losses
        if self.peak_flops:
            out["mfu"] = out["tokens_per_s"] * self.flops_per_token / (self.world * self.peak_flops)
        memory = [r[3] / 2**30 for r in rows]
        out["peak_memory_gb"] = max(memory)
        out |= {f"peak_memory_gb_rank{r}": gb for r, gb in enumerate(memory)}
        return out

    def _report(self, metrics: dict) -> None:
        text = [f"loss {metrics['loss']:.4f}"] if "loss" in metrics else []
        text += [f"{metrics['tokens_per_s']:,.0f} tokens/s", f"{metrics['step_s']:.3f} s/step"]
        text += [f"MFU {100 * metrics['mfu']:.1f}%"] if "mfu" in metrics else []
        text += [f"peak memory {metrics['peak_memory_gb']:.2f} GiB (largest rank)"]
        if self._bar is not None:
            self._bar.set_postfix_str(", ".join(text))
        elif self.stdout:
            print(f"shardcore step {self.steps}: {', '.join(text)}", flush=True)
        for sink in self.sinks:
            sink(metrics, self.steps)

    def close(self) -> None:
        """The last window flushed (collective), the progress bar and the sinks closed."""
        self.flush()
        if self._bar is not None:
            self._bar.close()
        for sink in self.sinks:
            getattr(sink, "close", lambda: None)()


class _TensorBoard:
    def __init__(self, log_dir: str) -> None:
        self.log_dir, self.writer = log_dir, None

    def __call__(self, metrics: dict, step: int) -> None:
        if self.writer is None:  # made on first use: rank 0's, when it logs
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self.writer = SummaryWriter(self.log_dir)
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def tensorboard(log_dir: str) -> Callable[[dict, int], None]:
    """A sink writing each window's metrics as TensorBoard scalars under ``log_dir`` (``pip install tensorboard``)."""
    try:
        import tensorboard as _  # noqa: F401
    except ImportError:
        raise ImportError(
            "shardcore.metrics.tensorboard needs the tensorboard package: pip install tensorboard"
        ) from None
    return _TensorBoard(str(log_dir))


def wandb(run=None) -> Callable[[dict, int], None]:
    """A sink logging each window's metrics to a W&B run: ``run``, else the one ``wandb.init`` started."""

    def log(metrics: dict, step: int) -> None:
        import wandb as _wandb

        target = run if run is not None else _wandb.run
        if target is None:
            raise RuntimeError("shardcore.metrics.wandb: no W&B run; call wandb.init(...) on rank 0 first")
        target.log(metrics, step=step)

    return log


def mlflow(run_id: str | None = None) -> Callable[[dict, int], None]:
    """A sink logging each window's metrics to an MLflow run: ``run_id``, else the active one
    (``mlflow.start_run``), on the tracking URI the caller set (``pip install mlflow-skinny``)."""

    def log(metrics: dict, step: int) -> None:
        import mlflow as _mlflow
        from mlflow.entities import Metric

        target = run_id if run_id is not None else getattr(_mlflow.active_run(), "info", None)
        if target is None:
            raise RuntimeError("shardcore.metrics.mlflow: no MLflow run; call mlflow.start_run() on rank 0 first")
        stamp = int(time.time() * 1000)
        rows = [Metric(key, float(value), stamp, step) for key, value in metrics.items()]
        _mlflow.MlflowClient().log_batch(run_id or target.run_id, metrics=rows)

    return log
