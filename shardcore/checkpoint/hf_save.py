"""Saving a sharded model as a HuggingFace checkpoint: every tensor gathered to its unsharded shape and
written by the first rank, shard file by shard file (the library's own loader reads it)."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..data_parallel import dp_full, native_class, reshard
from ..distributed.collectives import group_device
from ..distributed.objects import all_gather_object, barrier, recv, send
from ..pipeline import tensor_aliases
from ..sharded_state import parameter_specs
from .hf import _full_shape, model_tensors
from .materialize import checkpoint_names
from .safetensors_io import (
    INDEX,
    MARKER,
    SINGLE,
    STAGING,
    StreamingSafetensors,
    parse_size,
    tensor_nbytes,
    weight_files,
)


def _coords(model: nn.Module) -> dict[str, int]:
    return model.shardcore.layout.coordinates(dist.get_rank())


def _pipeline_entries(model: nn.Module, local: list) -> tuple[list, dict[str, int]]:
    """Every stage's tensors (collective): ``(entries in stage order, {name: pp coordinate})``.
    A tied parameter is written once, under the name the first stage holding it gives it."""
    layout = model.shardcore.layout
    aliases = tensor_aliases(model)
    everyone = all_gather_object((_coords(model), local), where="save_checkpoint: what each stage holds")
    entries, stage_of = [], {}
    for coords, held in sorted(everyone, key=lambda e: e[0]["pp"]):
        if any(coords[d] for d in ("dp", "sp", "tp")):
            continue  # one rank per stage says what it holds
        for name, shape, dtype in held:
            if name in stage_of or any(a in stage_of for a in aliases.get(name, [])):
                continue
            entries.append((name, shape, dtype))
            stage_of[name] = coords["pp"]
    assert layout.pp == len({c["pp"] for c, _ in everyone})
    return entries, stage_of


def _to_writer(model: nn.Module, full: torch.Tensor | None, stage: int, shape, dtype) -> torch.Tensor | None:
    """Pipeline: the first rank of the stage holding a tensor sends it to the writer (global rank 0)."""
    layout = model.shardcore.layout
    coords = _coords(model)
    source = next(
        r
        for r in range(dist.get_world_size())
        if layout.coordinates(r) == {**coords, "dp": 0, "sp": 0, "tp": 0, "pp": stage}
    )
    if stage == 0:
        return full  # the writer's own stage
    device = group_device(dist.group.WORLD)  # an NCCL-only world sends and receives device tensors
    where = "save_checkpoint: a pipeline stage's tensor to the writer"
    if dist.get_rank() == source:
        send(full.to(device), 0, None, where=where)
        return None
    if dist.get_rank() == 0:
        return recv(torch.empty(shape, dtype=dtype, device=device), source, None, where=where)
    return None


def _save_config(model: nn.Module, path: Path, entries) -> None:
    """A HuggingFace model's ``config.json`` as ``save_pretrained`` writes it: with the model's
    class as ``architectures`` and its weights' dtype, without run-time-only fields."""
    config = getattr(model, "config", None)
    if not hasattr(config, "save_pretrained"):
        return
    config = copy.deepcopy(config)
    if hasattr(model, "base_model_prefix"):  # a transformers model: from_pretrained picks the class from it
        config.architectures = [native_class(model).__name__]
    dtypes = [dtype for _, _, dtype in entries if dtype.is_floating_point]
    if dtypes:
        # transformers 5 names it ``dtype`` (``torch_dtype`` is a property aliasing it); 4.x ``torch_dtype``
        key = "dtype" if isinstance(getattr(type(config), "torch_dtype", None), property) else "torch_dtype"
        setattr(config, key, max(set(dtypes), key=dtypes.count))
    config.__dict__.pop("_attn_implementation_autoset", None)  # 4.x: set at run time, not a setting
    config.save_pretrained(path)


def save_checkpoint(model: nn.Module, path: str | os.PathLike, *, max_shard_size: int | str = "5GB") -> None:
    """Write ``model`` as a HuggingFace checkpoint directory: full, unpadded tensors, native names.

    Collective over the model's ranks: call it on every rank. The first rank writes
    ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` files and
    ``model.safetensors.index.json`` when the tensors exceed ``max_shard_size``) and, for
    HuggingFace models, ``config.json``. Tied parameters are written once, as ``save_pretrained``
    does. Split tensors are gathered one at a time.
    """
    path = Path(path)
    writer = not dist.is_initialized() or dist.get_rank() == 0
    specs = parameter_specs(reshard(model))
    tensors = {name: t for name, t, _ in model_tensors(model)}
    entries = [(name, _full_shape(t, specs.get(name, (None,))[0]), t.dtype) for name, t in tensors.items()]
    if any(t.is_meta for t in tensors.values()):
        raise RuntimeError("save_checkpoint: the model still has meta tensors; load its weights first")
    stage_of: dict[str, int] = {}  # pipeline: the pp coordinate of the stage each tensor comes from
    if getattr(getattr(model, "shardcore", None), "pipeline", None) is not None:
        entries, stage_of = _pipeline_entries(model, entries)
    renamed = checkpoint_names(model, [e[0] for e in entries])
    limit = parse_size(max_shard_size)
    files: list[list[tuple[str, tuple[int, ...], torch.dtype]]] = [[]]
    size = 0
    for entry in entries:
        nbytes = tensor_nbytes(entry[1], entry[2])
        if files[-1] and size + nbytes > limit:
            files.append([])
            size = 0
        files[-1].append(entry)
        size += nbytes
    names = (
        [SINGLE]
        if len(files) == 1
        else [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    )
    stage = path / STAGING  # written whole there first: the directory's checkpoint stays until this one is
    if writer:
        _stage(model, stage, entries, names, files, renamed)
    for file_name, group in zip(names, files, strict=True):
        on_disk = [(renamed.get(name, name), shape, dtype) for name, shape, dtype in group]
        stream = StreamingSafetensors(stage / file_name, on_disk) if writer else None
        for name, shape, dtype in group:
            full = None
            if name in tensors and (not stage_of or stage_of[name] == _coords(model)["pp"]):
                local = dp_full(tensors[name])  # FSDP: this rank's data-parallel shard -> the TP slice
                spec, pg = specs.get(name, (None, None))
                full = local if spec is None else spec.gather(local, pg)  # one full tensor at a time
            if stage_of:  # pipeline: the stage holding it sends it to the writer
                full = _to_writer(model, full, stage_of[name], shape, dtype)
            if stream is not None:
                stream.write(full)
            del full
        if stream is not None:
            stream.close()
    if writer:
        _replace(path, stage)
    if dist.is_initialized():
        barrier(where="save_checkpoint: every rank waits for the writer")


def _stage(model: nn.Module, stage: Path, entries, names: list[str], files: list, renamed: dict) -> None:
    """The staging directory, fresh, with the config and (several files) the index."""
    if stage.exists():  # an earlier save that never finished
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    _save_config(model, stage, entries)
    if len(files) > 1:
        index = {renamed.get(e[0], e[0]): n for n, group in zip(names, files, strict=True) for e in group}
        total = sum(tensor_nbytes(shape, dtype) for _, shape, dtype in entries)
        (stage / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2))


def _replace(path: Path, stage: Path) -> None:
    """Make the checkpoint written whole in ``stage`` the directory's: no file of an earlier checkpoint
    survives (a stale index would be read first). :data:`MARKER` says "incomplete" while the files
    move and lists the new weight files, with their sizes, once they are all in place."""
    marker, tmp = path / MARKER, path / (MARKER + ".tmp")
    marker.write_text(json.dumps({"complete": False}))
    for old in weight_files(path):
        if old != marker:
            old.unlink()
    written = sorted(stage.iterdir())
    for new in written:
        os.replace(new, path / new.name)
    stage.rmdir()
    weights = {
        f.name: (path / f.name).stat().st_size
        for f in written
        if f.name.endswith((".safetensors", ".json")) and f.name != "config.json"
    }
    tmp.write_text(json.dumps({"complete": True, "files": weights}, indent=1))
    os.replace(tmp, marker)
