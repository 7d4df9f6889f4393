"""Checkpoint checks: lazy load against the unsharded model, save round trips, resharded resumes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .compare import _check_outputs, _loss, snapshot
from .steps import assert_trained_close
from .tolerance import OUTPUT, STEP

__all__ = [
    "assert_lazy_load_matches",
    "assert_resume_matches",
    "assert_same_checkpoint",
    "rows_read",
    "train_and_save",
]


def assert_lazy_load_matches(
    build: Callable[[], nn.Module],
    inputs: Mapping[str, Any],
    checkpoint: str,
    config=None,
    *,
    save_to: str | None = None,
    seed: int = 0,
    rtol: float = OUTPUT.rtol,
    policy=None,
    meta: str = "init_empty",
) -> float:
    """Build the model with its parameters on the meta device (:func:`shardcore.init_empty`), shard it, load ``checkpoint`` into it and compare its
    outputs with ``build()`` (seeded with ``seed``; the checkpoint must hold that model's weights)
    within the output tolerance of :func:`assert_sharded_matches` (``rtol`` of each output's largest
    element, :mod:`.tolerance`: split matmuls sum in another order). ``meta="device"`` builds under
    ``torch.device("meta")`` instead (buffers then recomputed after loading). With ``save_to``, then write it back with :func:`shardcore.save_checkpoint`
    (compare the directories with :func:`assert_same_checkpoint`). Run on every rank."""
    import shardcore

    torch.manual_seed(seed)
    ref = build().eval()
    with shardcore.init_empty() if meta == "init_empty" else torch.device("meta"):
        model = build()
    model = shardcore.optimize(model.eval(), config, policy=policy)
    shardcore.load_checkpoint(model, checkpoint)
    with torch.no_grad():
        skip = ("past_key_values", "cache")  # each rank's KV cache holds its own heads
        worst = _check_outputs(ref(**inputs), model(**inputs), skip, rtol, what=" after lazy load")
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


def _part(model: nn.Module, batch: Mapping[str, Any]) -> Mapping[str, Any]:
    """The part of a global batch this rank feeds: all of it, or under ``data_parallel`` its
    data-parallel rank's part (:func:`~shardcore.testing.dp_part`)."""
    info = getattr(model, "shardcore", None)
    if info is None or info.data_parallel is None:
        return batch
    import torch.distributed as dist

    from .data_parallel import dp_part

    return dp_part(batch, info.layout.coordinates(dist.get_rank())["dp"], info.layout.dp)


def _train(model: nn.Module, batches, loss_fn, *, lr: float, eps: float, state=None):
    opt = state if state is not None else torch.optim.AdamW(model.parameters(), lr=lr, eps=eps)
    for batch in batches:
        opt.zero_grad()
        if loss_fn is None:  # the model's loss: through the pipeline's stages too
            import shardcore

            shardcore.pipeline_step(model, _part(model, batch))
        else:
            _loss(model(**_part(model, batch)), loss_fn).backward()
        opt.step()
    return opt


def train_and_save(
    build: Callable[[], nn.Module],
    batches: list[Mapping[str, Any]],
    config,
    path: str,
    *,
    policy=None,
    loss_fn: Callable | None = None,
    seed: int = 0,
    lr: float = 1e-3,
    adam_eps: float = 1e-5,
) -> None:
    """First half of a resume check: shard ``build()`` (seeded), take one AdamW step per batch
    (each data-parallel rank on its part of it, under ``data_parallel``), then :func:`shardcore.save_distributed` model and optimizer to ``path``. Run on every rank."""
    import shardcore

    torch.manual_seed(seed)
    model = shardcore.optimize(build(), config, policy=policy)
    opt = _train(model, batches, loss_fn, lr=lr, eps=adam_eps)
    shardcore.save_distributed(model, path, opt)


def assert_resume_matches(
    build: Callable[[], nn.Module],
    saved_batches: list[Mapping[str, Any]],
    batches: list[Mapping[str, Any]],
    config,
    path: str,
    *,
    policy=None,
    loss_fn: Callable | None = None,
    seed: int = 0,
    lr: float = 1e-3,
    adam_eps: float = 1e-5,
    rtol: float = STEP.rtol,
) -> float:
    """Second half: a model sharded by ``config`` (any layout) and built from *another* seed, so a
    tensor the checkpoint does not restore cannot start right, loads ``path`` with
    :func:`shardcore.load_distributed`, trains on ``batches`` and must match, on every rank, an
    unsharded model (``seed``) trained on ``saved_batches + batches`` without interruption (within
    ``rtol`` of the update's own size, :mod:`.tolerance`)."""
    import shardcore

    torch.manual_seed(seed + 1)
    model = shardcore.optimize(build(), config, policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=adam_eps)
    shardcore.load_distributed(model, path, opt)
    _train(model, batches, loss_fn, lr=lr, eps=adam_eps, state=opt)
    torch.manual_seed(seed)
    ref = build()
    before = snapshot(ref)
    _train(ref, [*saved_batches, *batches], loss_fn, lr=lr, eps=adam_eps)
    expected = dict(ref.named_parameters(remove_duplicate=False))  # tied: a stage's name for it
    return assert_trained_close(dict(shardcore.full_named_tensors(model)), expected, before, "after resuming", rtol)


@contextlib.contextmanager
def rows_read() -> Iterator[list[tuple[str, int]]]:
    """``(checkpoint key, bytes)`` of every run of rows :func:`shardcore.load_checkpoint` reads inside the
    block by :meth:`SafetensorsFile.read_rows <shardcore.checkpoint.safetensors_io.SafetensorsFile.read_rows>`
    (every piece of a tensor kept in pieces, every split tensor): what this rank read of the files."""
    from ..checkpoint import safetensors_io

    read, original = [], safetensors_io.SafetensorsFile.read_rows

    def counting(self, key, dim, ranges, dtype):
        out = original(self, key, dim, ranges, dtype)
        read.append((key, out.numel() * out.element_size()))
        return out

    safetensors_io.SafetensorsFile.read_rows = counting
    try:
        yield read
    finally:
        safetensors_io.SafetensorsFile.read_rows = original
