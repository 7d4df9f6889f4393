"""HuggingFace-format checkpoints for sharded models: load slice by slice, save gathered tensor by tensor.

* :func:`load_checkpoint` reads a checkpoint directory (``model.safetensors``, or several files
  with ``model.safetensors.index.json``) into a sharded model, each rank reading only the rows
  it holds (positioned reads of exactly its bytes), never a whole split tensor. A model built on the meta
  device (``with torch.device("meta"): ...``) is materialized by it, rank by rank.
* :func:`save_checkpoint` writes full, unpadded tensors under the native names, in safetensors
  files (with an index above ``max_shard_size``) that ``from_pretrained`` reads back unsharded.
  Split tensors are gathered one at a time and streamed to disk by the first rank, so no rank
  ever holds more than one full tensor.

Every check (missing tensor, wrong shape, unreadable or truncated file) runs on every rank
before the first collective, so a bad checkpoint fails everywhere alike instead of hanging.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..data_parallel import dp_assign, reshard
from ..distributed.collectives import group_rank
from ..meta import unguard_meta
from ..pipeline import tensor_aliases
from ..sharded_state import parameter_specs
from .library import library_names, library_parts
from .materialize import checkpoint_names, checkpoint_parts, materialize_buffers, replace_tensors
from .parts import StackedParts
from .safetensors_io import (
    CheckpointError,
    SafetensorsFile,
    weight_map,
)

__all__ = ["load_checkpoint", "model_tensors"]


def _resolve_key(name: str, available: dict, prefix: str | None, renamed: dict[str, str]) -> str | None:
    """The checkpoint key for model tensor ``name``: as is, in the library's checkpoint naming, or
    with the base-model prefix added or stripped."""
    stripped = name[len(prefix) + 1 :] if prefix and name.startswith(prefix + ".") else None
    named = [renamed.get(n) for n in (name, f"{prefix}.{name}" if prefix else None, stripped) if n is not None]
    for candidate in (name, *named):
        if candidate is None:
            continue
        if candidate in available:
            return candidate
        if prefix and candidate.startswith(prefix + ".") and candidate[len(prefix) + 1 :] in available:
            return candidate[len(prefix) + 1 :]
        if prefix and f"{prefix}.{candidate}" in available:
            return f"{prefix}.{candidate}"
    return None


def model_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """``(name, tensor, is_parameter)``: parameters (tied ones once) and persistent buffers."""
    for name, param in model.named_parameters():
        yield name, param, True
    persistent = set(model.state_dict(keep_vars=True))
    for name, buf in model.named_buffers():
        if name in persistent:
            yield name, buf, False


def _full_shape(tensor: torch.Tensor, spec) -> tuple[int, ...]:
    shape = list(tensor.shape)
    if spec is not None:
        shape[spec.dim] = spec.full_size
    return tuple(shape)


def load_checkpoint(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    progress: bool | None = None,
    zero_copy: bool = True,
) -> nn.Module:
    """Load a HuggingFace safetensors checkpoint into ``model`` (sharded or not, built on meta or not).

    Each rank reads only its slices. Parameters and persistent buffers must all be present with
    their full (unsharded) shapes, else :class:`CheckpointError` names the tensor; checkpoint keys
    the model does not have are ignored (as ``from_pretrained`` does). Meta tensors are replaced
    by real ones on ``device`` (default: CPU, or the current CUDA device under nccl); buffers the
    checkpoint does not hold are then computed by the model's own initialization (see
    :attr:`CheckpointSpec.materialize <shardcore.spec.CheckpointSpec>`). Shows a progress bar on the first rank when
    ``tqdm`` is installed and the checkpoint is large (``progress=None``), or as asked.

    ``zero_copy=True`` (CPU, meta-built models): slices that are one contiguous run of the file
    (replicated tensors, row blocks of column-parallel weights) become copy-on-write views of the
    memory-mapped file, read from the page cache when first used; the others are read into memory.
    ``zero_copy=False`` reads everything up front. :func:`save_checkpoint` replaces files
    atomically, so saving over the checkpoint a model was loaded from is safe either way.
    """
    path = Path(path)
    files = weight_map(path)
    if device is None:
        nccl = dist.is_initialized() and dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    plan, problems = _read_plan(model, files)
    handles: dict[Path, SafetensorsFile] = {}
    try:
        zero_copy = zero_copy and torch.device(device).type == "cpu"
        for file in sorted({files[k] for p in plan for k in _keys(p[3])}, key=str):
            handles[file] = SafetensorsFile(file, zero_copy=zero_copy)
        problems += _shape_problems(plan, files, handles)
        if problems:
            raise CheckpointError(f"checkpoint {path} does not fit {type(model).__name__}: " + "; ".join(problems))
        if _materialize_dp_shards(model, device):  # FSDP over a meta build: allocate the shards, then fill them
            now = {name: tensor for name, tensor, _ in model_tensors(model)}
            plan = [(name, now[name], *rest) for name, _, *rest in plan]
        replaced = _read_slices(plan, files, handles, device, progress)
    finally:
        for handle in handles.values():
            handle.close()
    replace_tensors(model, replaced)
    materialize_buffers(model, device)
    unguard_meta(model)
    return model


def _read_plan(model: nn.Module, files: dict) -> tuple[list[tuple], list[str]]:
    """``(name, tensor, is_param, checkpoint key, spec, group)`` of every tensor the model needs,
    and the names of those the checkpoint lacks (a tied tensor may be held under another name)."""
    specs = parameter_specs(reshard(model))
    prefix = getattr(model, "base_model_prefix", None)
    tensors = list(model_tensors(model))
    renamed = {**library_names(model, files), **checkpoint_names(model, [name for name, _, _ in tensors])}
    parts, unread = library_parts(model, files, [name for name, _, _ in tensors])
    parts |= checkpoint_parts(model, [name for name, _, _ in tensors])  # the policy's own, if it says
    aliases = tensor_aliases(model)
    plan, problems = [], []
    for name, tensor, is_param in tensors:
        key = _resolve_key(name, files, prefix, renamed)
        for alias in aliases.get(name, []) if key is None else []:  # tied, held under another name
            key = key or _resolve_key(alias, files, prefix, renamed)
        if key is None and name in parts:  # kept in pieces by the library's format
            key = parts[name].renamed(lambda k: _resolve_key(k, files, prefix, {}))
        spec, group = specs.get(name, (None, None))
        if key is None:
            problems.append(f"missing tensor {name!r}" + (f" ({unread[name]})" if name in unread else ""))
            continue
        plan.append((name, tensor, is_param, key, spec, group))
    return plan, problems


def _keys(key) -> list[str]:
    return key.all_keys() if isinstance(key, StackedParts) else [key]


def _shape_problems(plan: list[tuple], files: dict, handles: dict) -> list[str]:
    """Every planned tensor is in its file with the full (unsharded) shape the model expects."""
    problems = []
    for name, tensor, _, key, spec, _ in plan:
        if isinstance(key, StackedParts):
            absent = [k for k in key.all_keys() if k not in handles[files[k]].entries]
            saved = None if absent else key.full_shape(lambda k: handles[files[k]].shape(k))
            if absent or saved != _full_shape(tensor, spec):
                problems.append(
                    f"tensor {name!r}: its checkpoint pieces ({key.keys[0]}, ...) "
                    + (f"are not all in their files ({absent[0]!r} missing)" if absent else f"stack to {saved}")
                    + f", the model expects {list(_full_shape(tensor, spec))}"
                )
            continue
        if key not in handles[files[key]].entries:
            problems.append(f"tensor {name!r} is listed in the index but not in {files[key].name}")
            continue
        saved = handles[files[key]].shape(key)
        if saved != _full_shape(tensor, spec):
            problems.append(
                f"tensor {name!r} has shape {list(saved)} in the checkpoint, the model expects "
                f"{list(_full_shape(tensor, spec))}"
            )
    return problems


def _read_slices(plan: list[tuple], files: dict, handles: dict, device, progress) -> dict[int, torch.Tensor]:
    """Read this rank's slice of every planned tensor: meta tensors get new ones (returned by the
    id of the meta tensor they replace), real ones are filled in place."""
    total = sum(t.numel() * t.element_size() for _, t, *_ in plan)
    bar = _progress(len(plan), total, progress)
    replaced: dict[int, torch.Tensor] = {}
    for _, tensor, is_param, key, spec, group in plan:
        rank = group_rank(group) if spec else 0
        if isinstance(key, StackedParts):  # this rank's entries, from their pieces only
            local = key.read(
                lambda k, *a: handles[files[k]].read_rows(k, *a),
                lambda k: handles[files[k]].shape(k),
                spec,
                rank,
                tensor.dtype,
            )
        else:
            local = handles[files[key]].read(key, spec, rank, tensor.dtype)
        if tensor.device.type == "meta":
            moved = local.to(device)
            replaced[id(tensor)] = nn.Parameter(moved, requires_grad=tensor.requires_grad) if is_param else moved
        else:
            dp_assign(tensor, local)  # in place (FSDP: this rank's data-parallel shard of it)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return replaced


def _materialize_dp_shards(model: nn.Module, device) -> bool:
    """FSDP-sharded meta parameters cannot be swapped for loaded tensors (FSDP holds them): give
    them memory on ``device`` in place (``to_empty``, which FSDP2 supports), to be filled by the
    loader. Buffers are put back as they were (``to_empty`` would leave them uninitialized): computed
    ones keep their values, those still on meta are left for :func:`materialize_buffers`."""
    from ..data_parallel import is_dtensor

    if not any(is_dtensor(p) and p.is_meta for p in model.parameters()):
        return False
    buffers = [(m, n, b) for m in model.modules() for n, b in m._buffers.items() if b is not None]
    model.to_empty(device=device)
    for module, name, buf in buffers:
        module._buffers[name] = buf if buf.is_meta else buf.to(device)
    return True


def _progress(n: int, total_bytes: int, progress: bool | None):
    first = not dist.is_initialized() or dist.get_rank() == 0
    if progress is False or not first or (progress is None and total_bytes < 1 << 30):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=n, desc="loading shards", unit="tensor")
