"""Distributed checkpoints of a sharded model and its optimizer, through ``torch.distributed.checkpoint``,
loadable at another tensor-parallel size (resharding).

A split tensor is stored as the pieces its ranks hold, each under a key naming the dimension and
the rows of the full, unpadded tensor it covers (``model.<name>|<dim>|<start>:<stop>``), written once even when heads
are replicated; replicated tensors are stored whole (``model.<name>``). On load, every rank
computes the rows its new layout needs (any TP size, padding and replicated heads included),
asks DCP for exactly the pieces overlapping them, and assembles its slice: at the saved layout no
rank reads a full split tensor. Pieces are read whole, so a rank of a finer layout reads the saved
pieces containing its rows (resharded from TP=2 to TP=4, a rank reads half of each split tensor). Optimizer state shaped like its parameter (AdamW's ``exp_avg``, ``exp_avg_sq``)
is stored and resharded the same way; scalars and hyperparameters are stored whole.

A save becomes the checkpoint only once every rank's part is written (:mod:`.atomic`: a hidden
sibling, recorded, swapped in): a save killed midway leaves the earlier checkpoint in place, and
:func:`load_distributed` refuses a directory that is not a complete checkpoint, naming why.
"""

from __future__ import annotations

import os
import pathlib
import re

import torch
import torch.distributed as dist
from torch import nn

from ..data_parallel import dp_assign, dp_full, reshard
from ..distributed.collectives import group_rank
from ..distributed.objects import barrier
from ..pipeline import tensor_aliases
from ..sharded_state import parameter_specs
from . import atomic

__all__ = ["load_distributed", "save_distributed"]

_PIECE = re.compile(r"^(?P<base>.+)\|(?P<dim>\d+)\|(?P<start>\d+):(?P<stop>\d+)$")


def _pieces(tensor: torch.Tensor, spec, rank: int) -> list[tuple[int, int, torch.Tensor]]:
    """``(start, stop, rows)`` of the full tensor this rank writes: the shards it is the first holder of."""
    out, local_offset = [], 0
    for seg, (start, stop, _) in zip(spec.segments, spec.ranges(rank), strict=True):
        shard = spec.shard_index(seg, rank)
        first_holder = -(-shard * spec.tp_size // seg.num_shards)
        if rank == first_holder and stop > start:
            out.append((start, stop, tensor.narrow(spec.dim, local_offset, stop - start)))
        local_offset += seg.shard_len
    return out


def _flatten(model: nn.Module, optimizer: torch.optim.Optimizer | None):
    """``(prefix, name, tensor, spec, group)`` for model tensors and tensor optimizer state."""
    specs = parameter_specs(reshard(model))
    names = {id(p): n for n, p in model.named_parameters()}
    for name, param in model.named_parameters():
        yield "model", name, param.detach(), *specs.get(name, (None, None))
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            name = names[id(param)]
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor):
                    spec, pg = specs.get(name, (None, None)) if value.shape == param.shape else (None, None)
                    yield f"optim.{key}", name, value, spec, pg


def save_distributed(model: nn.Module, path: str | os.PathLike, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Save ``model`` (and ``optimizer``) with ``torch.distributed.checkpoint``; collective, call on every rank."""
    state: dict[str, object] = {}
    for prefix, name, tensor, spec, group in _flatten(model, optimizer):
        tensor = dp_full(tensor)  # FSDP: the data-parallel shards -> this rank's TP slice
        if spec is None:
            state[f"{prefix}.{name}"] = tensor
        else:
            for start, stop, rows in _pieces(tensor, spec, group_rank(group)):
                state[f"{prefix}.{name}|{spec.dim}|{start}:{stop}"] = rows.contiguous()
    if optimizer is not None:
        state["optim.param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    import torch.distributed.checkpoint as dcp  # here: most processes never checkpoint (0.3 s of import)

    path = pathlib.Path(path)
    first = not dist.is_initialized() or dist.get_rank() == 0
    staging = atomic.prepare(path) if first else atomic.staging_dir(path)
    if dist.is_initialized():
        barrier(where="save_distributed: the staging directory is ready")
    dcp.save(state, checkpoint_id=str(staging))
    if dist.is_initialized():
        barrier(where="save_distributed: every rank's part is written")
    if first:
        atomic.finish(path, staging)
    if dist.is_initialized():
        barrier(where="save_distributed: the checkpoint is in place")


def load_distributed(model: nn.Module, path: str | os.PathLike, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load a :func:`save_distributed` checkpoint into ``model`` (and ``optimizer``), at any TP size.

    ``optimizer`` must be built over ``model``'s parameters; its state is created from the
    checkpoint. Collective: call on every rank.
    """
    import torch.distributed.checkpoint as dcp  # here: most processes never checkpoint (0.3 s of import)

    atomic.check(pathlib.Path(path))  # before any collective: every rank reads the same directory
    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    saved: dict[str, list[tuple[int, int, str]]] = {}  # base -> (start, stop, key); (-1, -1) if whole
    split_dim: dict[str, int] = {}
    for key in metadata:
        match = _PIECE.match(key)
        if match:
            saved.setdefault(match["base"], []).append((int(match["start"]), int(match["stop"]), key))
            split_dim[match["base"]] = int(match["dim"])
        else:
            saved.setdefault(key, []).append((-1, -1, key))

    wanted = []  # (base, destination tensor, spec, rank)
    if optimizer is not None:
        _init_optimizer_state(model, optimizer)
    aliases = tensor_aliases(model)
    for prefix, name, tensor, spec, group in _flatten(model, optimizer):
        base = f"{prefix}.{name}"
        if base not in saved:  # a tied parameter a pipeline stage holds under another of its names
            base = next((f"{prefix}.{a}" for a in aliases.get(name, []) if f"{prefix}.{a}" in saved), base)
        if base not in saved:
            raise KeyError(f"distributed checkpoint {path} has no {base!r}")
        wanted.append((base, tensor, spec, group_rank(group) if spec is not None else 0))

    request: dict[str, object] = {}
    for base, tensor, spec, rank in wanted:
        for _, _, key in _overlapping(saved[base], spec, rank):
            request[key] = torch.empty(metadata[key].size, dtype=tensor.dtype)
    if optimizer is not None:
        request["optim.param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    dcp.load(request, checkpoint_id=str(path))

    for base, tensor, spec, rank in wanted:
        like = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)  # plain, also for a DTensor
        dp_assign(tensor, _assemble(saved[base], request, like, spec, rank, split_dim.get(base, 0)))
    if optimizer is not None:
        for group, loaded in zip(optimizer.param_groups, request["optim.param_groups"], strict=True):
            group.update(loaded)


def _overlapping(saved: list[tuple[int, int, str]], spec, rank: int) -> list[tuple[int, int, str]]:
    """The saved pieces this rank's slice needs: those overlapping its rows (all, if it holds the
    tensor whole; a tensor saved whole is one piece and always needed)."""
    if spec is None:
        return saved
    rows = [(start, stop) for start, stop, _ in spec.ranges(rank) if stop > start]
    return [(lo, hi, key) for lo, hi, key in saved if lo < 0 or any(max(lo, a) < min(hi, b) for a, b in rows)]


def _rows(saved: list[tuple[int, int, str]], request: dict, start: int, stop: int, dim: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of a full tensor along ``dim``, from the requested saved pieces (or whole tensor)."""
    parts = []
    for lo, hi, key in sorted(p for p in saved if p[2] in request):
        if lo < 0:  # stored whole
            return request[key].narrow(dim, start, stop - start)
        a, b = max(lo, start), min(hi, stop)
        if a < b:
            parts.append(request[key].narrow(dim, a - lo, b - a))
    got = sum(p.shape[dim] for p in parts)
    if got != stop - start:
        raise ValueError(f"distributed checkpoint covers {got} of rows [{start}, {stop})")
    return torch.cat(parts, dim=dim)


def _assemble(saved, request, like: torch.Tensor, spec, rank: int, saved_dim: int) -> torch.Tensor:
    if spec is None:  # replicated now: the whole tensor, from the pieces if it was split
        if len(saved) == 1 and saved[0][0] < 0:
            return request[saved[0][2]]
        return _rows(saved, request, 0, like.shape[saved_dim], saved_dim)
    pieces = []
    for start, stop, pad in spec.ranges(rank):
        if stop > start:
            pieces.append(_rows(saved, request, start, stop, spec.dim))
        if pad:
            shape = list(like.shape)
            shape[spec.dim] = pad
            pieces.append(like.new_zeros(shape))
    return torch.cat(pieces, dim=spec.dim)


def _init_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's per-parameter state (zeros) so it can be filled from the checkpoint."""
    if all(optimizer.state.get(p) for g in optimizer.param_groups for p in g["params"]):
        return
    saved_grads = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            saved_grads[p] = p.grad
            p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    params = [p for g in optimizer.param_groups for p in g["params"]]
    before = [p.detach().clone() for p in params]
    optimizer.step()  # with zero gradients and lr 0: creates the state, leaves parameters as they were
    with torch.no_grad():
        for p, b in zip(params, before, strict=True):
            p.copy_(b)
    for g, lr in zip(optimizer.param_groups, lrs, strict=True):
        g["lr"] = lr
    for p, grad in saved_grads.items():
        p.grad = grad
