"""What each worker of :func:`shardcore.parallelize` runs: the model built from its pickled structure on
the meta device, sharded, its checkpoint loaded; then calls on it, their outputs moved to the CPU.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..config import ShardConfig
from ..distributed.worker import loads_payload

_MODELS: dict[str, nn.Module] = {}  # in each worker: the sharded models of the handles it serves
_STRIPPED = (
    "past_key_values",
    "cache",
)  # output fields that hold one worker's heads only (``cache``: transformers >= 5.24)


class _MetaPickler(pickle.Pickler):
    """Pickles a module with its parameters and persistent buffers as empty meta tensors."""

    def __init__(self, file, held: dict[int, bool], dtype: torch.dtype | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._held, self._dtype = held, dtype

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and id(obj) in self._held:
            dtype = self._dtype if (self._dtype is not None and obj.is_floating_point()) else obj.dtype
            return _meta_tensor, (tuple(obj.shape), dtype, self._held[id(obj)], obj.requires_grad)
        return NotImplemented


def _meta_tensor(shape, dtype, is_param: bool, requires_grad: bool) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device="meta")
    return nn.Parameter(t, requires_grad=requires_grad) if is_param else t


def _structure(model: nn.Module, dtype: torch.dtype | None) -> bytes:
    from ..checkpoint.hf import model_tensors

    held = {id(t): is_param for _, t, is_param in model_tensors(model)}  # what the checkpoint holds
    import io

    buf = io.BytesIO()
    try:
        _MetaPickler(buf, held, dtype).dump(model)
    except Exception as err:
        raise TypeError(
            f"parallelize: cannot send the structure of {type(model).__name__} to the workers ({err}); "
            "save it with save_pretrained(directory) (or shardcore.save_checkpoint) and pass the directory"
        ) from err
    return buf.getvalue()


# ----------------------------------------------------------------------------- worker side


def _build(key: str, source: Mapping, config: ShardConfig, policy, dtype, device_type: str) -> None:
    from ..checkpoint import load_checkpoint
    from ..checkpoint.materialize import replace_tensors
    from ..distributed.objects import barrier
    from ..meta import init_empty
    from ..steps import shard

    if "structure" in source:
        model = loads_payload(source["structure"])  # classes of the caller's script found there
    else:
        import transformers
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(source["checkpoint"])
        cls = getattr(transformers, source["architecture"], None)
        if cls is None:
            raise ValueError(
                f"config.json names the architecture {source['architecture']!r}, which transformers "
                f"{transformers.__version__} does not have; build the model and pass it instead"
            )
        dtype = dtype or config_dtype(hf_config)
        with init_empty():  # parameters on meta, buffers computed by the modules as usual
            model = cls._from_config(hf_config)
        if dtype is not None:  # floating parameters only (meta: nothing moves); buffers keep their dtype
            converted = {
                id(p): torch.nn.Parameter(p.to(dtype), requires_grad=p.requires_grad)
                for p in model.parameters()
                if p.is_floating_point() and p.dtype != dtype
            }
            replace_tensors(model, converted)  # every reference: tied parameters stay tied
    model = shard(model.eval(), config, policy=policy)
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    # zero_copy=False: each worker's slices in its own memory, none left in a map of the file
    # (0.53x of the checkpoint per worker at world_size 2 against 0.59-0.63x with views, and a
    # temporary checkpoint's disk space is freed when it is deleted, not when the workers exit)
    load_checkpoint(model, source["checkpoint"], device=device, progress=False, zero_copy=False)
    _MODELS[key] = model.eval()
    barrier(
        where="a served model's load"
    )  # every worker holds its slices before the caller deletes a temporary checkpoint


def _call(key: str, method: str, args: tuple, kwargs: dict) -> Any:
    import torch.distributed as dist

    model = _MODELS[key]
    device = next(model.parameters()).device
    args, kwargs = _move(args, device), _move(kwargs, device)
    with torch.no_grad():
        out = getattr(model, method)(*args, **kwargs)
    if dist.get_rank() != 0:
        return None
    return _strip(_move(out, torch.device("cpu")))


def _move(obj, device: torch.device):
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_move(o, device) for o in obj)
    if isinstance(obj, list):
        return [_move(o, device) for o in obj]
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            moved = _move(v, device)
            if moved is not v:
                obj[k] = moved
        return obj
    return obj


def _strip(out):
    if isinstance(out, dict):
        for name in _STRIPPED:
            if out.get(name) is not None:
                with contextlib.suppress(Exception):
                    out[name] = None
                if hasattr(out, name):
                    with contextlib.suppress(Exception):
                        setattr(out, name, None)
    return out


def config_dtype(hf_config) -> torch.dtype | None:
    value = getattr(hf_config, "dtype", None)
    if value is None and "dtype" not in vars(hf_config):  # transformers 4.x names it torch_dtype
        value = getattr(hf_config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) else None
