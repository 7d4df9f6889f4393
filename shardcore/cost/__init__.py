"""What a layout costs on this machine: the measured profile (``shardcore calibrate``,
:mod:`shardcore.cost.profile`), the cost model over ``explain``'s counts (:mod:`shardcore.cost.model`),
the search over every layout of a world (``explain --auto``, :mod:`shardcore.cost.search`), and one
rank's memory tracked at real shapes beside the prediction (:func:`memory_check`, :mod:`shardcore.cost.tracked`)."""

from .model import collective_seconds, memory_per_rank, predict
from .profile import KINDS, calibrate, fit_line, load_profile, profile_path
from .search import candidates, search, shard_config
from .tracked import memory_check, tracked_memory

__all__ = [
    "KINDS",
    "calibrate",
    "candidates",
    "collective_seconds",
    "fit_line",
    "load_profile",
    "memory_check",
    "memory_per_rank",
    "predict",
    "profile_path",
    "search",
    "shard_config",
    "tracked_memory",
]
