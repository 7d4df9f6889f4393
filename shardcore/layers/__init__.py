"""Deprecated since 0.1: the parallel layers live in :mod:`shardcore.tensor_parallel`.

Plugins written against the 0.1 paths (``from shardcore.layers import Linear1D_Col``,
``from shardcore.layers.linear import Linear1D_Row``, ``shardcore.layers.comm``...) keep working:
importing this package warns once (``DeprecationWarning``, naming the new import) and every old
module name points at the module that holds its code now. The old paths go away in 0.3.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings

from .. import tensor_parallel as _new
from ..tensor_parallel import *  # noqa: F403  (the old package exported the layers at its top)

__all__ = list(_new.__all__)

#: 0.1 module -> the module (or modules) its code lives in now, under shardcore.tensor_parallel
MOVED = {
    "linear": ("linear",),
    "conv1d": ("conv1d",),
    "embedding": ("embedding",),
    "loss": ("loss",),
    "norm": ("norm",),
    "parallel_module": ("parallel_module",),
    "rng": ("rng",),
    "shard_spec": ("shard_spec",),
    "comm": ("mappings", "regions"),  # split in two when the core was laid out by parallelism
}

warnings.warn(
    "shardcore.layers is deprecated and goes away in 0.3: import from shardcore.tensor_parallel instead "
    "(e.g. `from shardcore.tensor_parallel import Linear1D_Col, Linear1D_Row`)",
    DeprecationWarning,
    stacklevel=2,
)


def _alias(old: str, new: tuple[str, ...]) -> types.ModuleType:
    modules = [importlib.import_module(f"shardcore.tensor_parallel.{name}") for name in new]
    if len(modules) == 1:
        return modules[0]
    joined = types.ModuleType(f"{__name__}.{old}", f"0.1's {old}: now {', '.join(m.__name__ for m in modules)}")
    for module in modules:
        joined.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    return joined


for _old, _names in MOVED.items():
    sys.modules[f"{__name__}.{_old}"] = _alias(_old, _names)
