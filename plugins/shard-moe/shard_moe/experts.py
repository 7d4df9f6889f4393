"""Moved: the expert layers are the core's, :mod:`shardcore.expert_parallel.experts` (this module
re-exports them with a ``DeprecationWarning``; it goes away in 0.3)."""

import warnings

from shardcore.plugin_api import (
    ExpertsEP,
    ExpertsTP,
)

warnings.warn(
    "shard_moe.experts moved to shardcore.expert_parallel.experts: import ExpertsTP / ExpertsEP from there "
    "(the old module goes away in 0.3)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["ExpertsEP", "ExpertsTP"]
