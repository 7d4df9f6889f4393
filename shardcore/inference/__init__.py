"""One-call tensor-parallel inference from a plain process: :func:`parallelize`.

No torchrun: :func:`parallelize` starts ``world_size`` workers (the project's
:class:`~shardcore.distributed.RankPool`), each builds the model on the meta device, shards it
with :func:`shardcore.optimize` and reads only its own slices with
:func:`shardcore.load_checkpoint`. The returned :class:`ParallelModel` is called like the model.

* From a **directory** (``config.json`` + safetensors, what ``from_pretrained`` reads): the class
  is the config's ``architectures[0]`` from ``transformers``; no process ever holds the whole
  model (the caller reads only ``config.json``).
* From an **in-memory module**: the caller writes it once to a temporary safetensors checkpoint
  (tensor by tensor) and sends each worker the module's *structure*: a pickle in which every
  parameter and persistent buffer is an empty meta tensor (a few kB to a few MB). Workers load
  their slices from the file, which is deleted once they hold them. Nothing goes through shared
  memory.

Each call sends the arguments to every worker and returns the first worker's result, moved to
the CPU. What is split over the workers is not returned as if it were whole: ``past_key_values``
(the cache holds each worker's heads only) comes back as ``None``, and ``output_attentions=True``
is refused. Failures: see :class:`~shardcore.distributed.RankPool` (a worker's exception is
raised in the caller with its traceback; a dead worker closes the handle; Ctrl+C stops them).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ShardConfig
from ..distributed.launcher import RankError, RankPool
from ..distributed.layout import ParallelLayout
from .served import _build, _call, _structure, config_dtype

__all__ = ["ParallelModel", "config_dtype", "parallelize", "read_config"]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- caller side


def parallelize(
    model_or_path: nn.Module | str | os.PathLike,
    world_size: int,
    *,
    config: ShardConfig | None = None,
    policy=None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    timeout_s: float = 300.0,
) -> ParallelModel:
    """Shard ``model_or_path`` over ``world_size`` new worker processes; return a model-like handle.

    ``config`` defaults to ``ShardConfig(tensor_parallel_size=world_size)``; ``policy`` overrides
    the plugin's (it is pickled to the workers). ``dtype``: the weights' dtype in the workers
    (default: the checkpoint's as the config records it, else float32; for a module, its own).
    ``device``: ``None``/``"cpu"`` (gloo), or ``"cuda"`` (worker ``r`` on ``cuda:r``, nccl).
    ``timeout_s`` bounds each collective. Every argument is checked before a process starts.
    """
    config, device = _check_arguments(world_size, config, device)

    start = time.perf_counter()
    if isinstance(model_or_path, nn.Module):
        hf_config = getattr(model_or_path, "config", None)
        structure = _structure(model_or_path, dtype)  # before any process starts: an unpicklable model fails here
    else:
        path = Path(model_or_path)
        hf_config, arch = read_config(path)
        from ..checkpoint.safetensors_io import weight_map

        weight_map(path)  # no safetensors here: the CheckpointError names the directory
        source = {"checkpoint": str(path), "architecture": arch}

    pool = cleanup = None
    try:
        # the workers start (and import torch) while the caller writes a module's temporary checkpoint
        pool = RankPool(
            world_size,
            timeout_s=timeout_s,
            backend="nccl" if device.type == "cuda" else "gloo",
            call_timeout=None,
            quiet=True,
        )
        if isinstance(model_or_path, nn.Module):
            from ..checkpoint import save_checkpoint

            cleanup = tempfile.mkdtemp(prefix="shardcore-parallelize-")
            save_checkpoint(model_or_path, cleanup)
            source = {"checkpoint": cleanup, "structure": structure}
        key = uuid.uuid4().hex
        pool.run(_build, key, source, config, policy, dtype, device.type)
    except BaseException:
        if pool is not None:
            pool.close(force=True)
        raise
    finally:
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
    logger.info("parallelize: %d workers ready in %.1f s", world_size, time.perf_counter() - start)
    return ParallelModel(pool, key, hf_config)


def _check_arguments(world_size, config: ShardConfig | None, device) -> tuple[ShardConfig, torch.device]:
    """Everything wrong with the arguments, before a process starts; the config and the device."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(
            "parallelize starts its own worker processes and is meant for a plain process; this one is "
            "already part of a process group (torchrun?): there, call shardcore.optimize on every rank"
        )
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"parallelize: world_size must be a positive int, got {world_size!r}")
    config = ShardConfig(tensor_parallel_size=world_size) if config is None else config
    try:  # a layout that does not fit fails here, not in N workers
        ParallelLayout.from_config(config, world_size)
    except ValueError as err:
        raise ValueError(
            f"parallelize(world_size={world_size}): the config does not fit: {str(err).split(';')[0]}; "
            "pass a world_size equal to the product of the config's parallel degrees"
        ) from None
    device = torch.device(device or "cpu")
    if device.type == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"parallelize: device='cuda' with world_size={world_size} needs {world_size} CUDA devices, "
            f"this machine has {torch.cuda.device_count()}"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"parallelize: device must be 'cpu' or 'cuda', got {str(device)!r}")
    return config, device


class ParallelModel:
    """A model sharded over worker processes, used like the model for inference.

    ``handle(**inputs)``/``handle.forward(...)`` and ``handle.generate(...)`` take the model's
    arguments and return its objects (tensors on the CPU). ``config`` is the model's config.
    A context manager; :meth:`close` (also at garbage collection and interpreter exit) stops and
    reaps every worker. After a worker died, every call raises :class:`RankError`.
    """

    def __init__(self, pool: RankPool, key: str, config) -> None:
        self._pool = pool
        self._key = key
        self.config = config
        self.world_size = pool.world_size
        self._finalizer = weakref.finalize(self, pool.close)

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (empty once closed)."""
        return self._pool.pids

    @property
    def closed(self) -> bool:
        return not self._pool.alive

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        if not self._pool.alive:
            deaths = self._pool.deaths()  # a worker that died between calls: named, the others reaped
            if deaths:
                self._pool.close(force=True)
                raise RankError(
                    f"{method} on a ParallelModel whose workers died since the last call: "
                    + "; ".join(f"rank {r}: {how}" for r, how in sorted(deaths.items()))
                    + "; create a new one with shardcore.parallelize"
                )
            raise RankError(
                "this ParallelModel is closed (a worker died, did not answer, or close() was called); "
                "create a new one with shardcore.parallelize"
            )
        if kwargs.get("output_attentions"):
            raise ValueError(
                "output_attentions=True is not supported through parallelize: each worker holds the "
                "attention weights of its own heads only"
            )
        try:
            return self._pool.run(_call, self._key, method, args, kwargs)[0]
        except TypeError as err:
            if err.__cause__ is None or not str(err).startswith("cannot send"):
                raise
            raise TypeError(
                f"{method}: an argument cannot be sent to the workers ({err.__cause__}); arguments travel "
                "pickled, so pass tensors and plain values (not streamers, callbacks or open files)"
            ) from err.__cause__

    def __call__(self, *args, **kwargs) -> Any:
        return self._call("__call__", args, kwargs)

    def forward(self, *args, **kwargs) -> Any:
        return self._call("forward", args, kwargs)

    def generate(self, *args, **kwargs) -> Any:
        return self._call("generate", args, kwargs)

    def close(self) -> None:
        """Stop the workers; no process of this handle remains when it returns. Idempotent."""
        self._finalizer()

    def __enter__(self) -> ParallelModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        name = type(self.config).__name__ if self.config is not None else "model"
        state = "closed" if self.closed else f"pids {self.pids}"
        return f"ParallelModel({name}, world_size={self.world_size}, {state})"


def read_config(path: Path, who: str = "parallelize"):
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{who}: {str(path)!r} is not a model directory (no config.json); pass a directory "
            "save_pretrained wrote, or the model itself"
        )
    archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    if not archs:
        raise ValueError(
            f"{who}: {path / 'config.json'} names no architectures, so the model class is unknown; "
            "build the model and pass it instead of the path"
        )
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path), archs[0]
