"""Parallel layers: each holds a rank's slice of a native module and knows its communication."""

from ..distributed.collectives import count_collectives
from .column_embedding import ColumnParallelEmbedding1D
from .conv1d import Conv1D_Col, Conv1D_Row, FusedConv1D_Col
from .embedding import VocabParallelEmbedding1D, VocabParallelLMHead1D
from .grad_sum import sum_gradients_over_group, summed_over
from .in_place import InPlace
from .linear import FusedLinear1D_Col, Linear1D_Col, Linear1D_Row
from .linear_loss import vocab_parallel_linear_cross_entropy
from .loss import vocab_parallel_cross_entropy
from .mappings import copy_to_tp, gather_from_tp, reduce_from_tp, split_to_tp
from .norm import FusedLayerNorm, FusedRMSNorm
from .parallel_module import ParallelModule
from .regions import enter_tp_region
from .rng import fork_tp_rng, run_in_shared_rng, run_in_tp_rng
from .selective import selective_checkpoint_context
from .shard_spec import Segment, ShardSpec
from .split_norm import SplitRMSNorm
from .vocab_slice import VocabSlice, VocabSliceError, gather_vocab

__all__ = [
    "ColumnParallelEmbedding1D",
    "Conv1D_Col",
    "Conv1D_Row",
    "FusedConv1D_Col",
    "FusedLayerNorm",
    "FusedLinear1D_Col",
    "FusedRMSNorm",
    "InPlace",
    "Linear1D_Col",
    "Linear1D_Row",
    "ParallelModule",
    "Segment",
    "ShardSpec",
    "SplitRMSNorm",
    "VocabParallelEmbedding1D",
    "VocabParallelLMHead1D",
    "VocabSlice",
    "VocabSliceError",
    "copy_to_tp",
    "count_collectives",
    "enter_tp_region",
    "fork_tp_rng",
    "gather_from_tp",
    "gather_vocab",
    "reduce_from_tp",
    "run_in_shared_rng",
    "run_in_tp_rng",
    "selective_checkpoint_context",
    "split_to_tp",
    "sum_gradients_over_group",
    "summed_over",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_linear_cross_entropy",
]
