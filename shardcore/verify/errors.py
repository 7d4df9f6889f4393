"""The error the checks raise."""

from __future__ import annotations

__all__ = ["ShardingCheckError"]


class ShardingCheckError(RuntimeError):
    """A plan shardcore did not author gave a different result from the unsharded model."""
