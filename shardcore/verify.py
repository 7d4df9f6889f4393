"""Checks that a sharded model computes what the unsharded one did."""

from __future__ import annotations

__all__ = ["ShardingCheckError"]


class ShardingCheckError(RuntimeError):
    """A plan shardcore did not author gave a different result from the unsharded model."""
