"""What a family declares, one frozen spec per parallelism, and the one rule that merges a composite's.

A :class:`~shardcore.Policy` says what tensor parallelism splits (its module descriptions, its blocks, its
checks of the config). Everything else a family may declare is one spec each, returned by one method of the
policy, read by the one step of ``optimize`` that needs it:

=====================================  ==========================  =========================================
policy method                          spec                        read by
=====================================  ==========================  =========================================
``tensor_parallel()``                  :class:`TensorParallelSpec`  the sharder (parallel output, gradient sums)
``pipeline()`` (``None``: refused)     :class:`PipelineSpec`        ``pipeline_parallel_size > 1``
``sequence()``                         :class:`SequenceSpec`        ``enable_sequence_parallelism``
``experts()``                          :class:`ExpertSpec`          ``expert_parallel_size``, ``global_batch_balance``
``data_parallel()``                    :class:`DataParallelSpec`    ``data_parallel="fsdp"`` / ``"hsdp"``
``kernels()``                          :class:`KernelSpec`          ``enable_fused_normalization``, ``enable_jit_fused``,
                                                                   ``enable_flash_attention``
``checkpoints()``                      :class:`CheckpointSpec`      ``load_checkpoint`` / ``save_checkpoint`` / lazy init
``checks()``                           :class:`ChecksSpec`          ``ShardConfig(verify=...)``
=====================================  ==========================  =========================================

Every spec's defaults are "not declared": a policy overrides only the methods of what it supports. A composite
(:class:`~shardcore.CompositePolicy`) answers each from its parts with the spec's own ``merge(own, parts)``:
written once here, for every composite.
"""

from __future__ import annotations

from .kinds import SPECS
from .model import CheckpointSpec, ChecksSpec, KernelSpec
from .parallel import DataParallelSpec, ExpertSpec, IdleRun, TensorParallelSpec
from .pipeline import PipelineSpec
from .sequence import SequenceSpec
from .under import under

__all__ = [
    "SPECS",
    "CheckpointSpec",
    "ChecksSpec",
    "DataParallelSpec",
    "ExpertSpec",
    "IdleRun",
    "KernelSpec",
    "PipelineSpec",
    "SequenceSpec",
    "TensorParallelSpec",
    "under",
]
