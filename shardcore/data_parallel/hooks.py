"""What a policy says about data parallelism (:class:`DataParallelHooks`, a base of :class:`~shardcore.Policy`)."""

from __future__ import annotations


class DataParallelHooks:
    """The data-parallel part of the policy contract (see :mod:`shardcore.data_parallel`)."""

    def data_parallel_shard_dims(self) -> dict[str, int]:
        """``{parameter name: dim}``: parameters ``ShardConfig(data_parallel="fsdp")`` splits over the
        data-parallel ranks along a dimension other than 0 (FSDP's default for the others). A
        plan's ``dp`` entries say it; policies rarely need to."""
        return {}
