"""An embedding split along its embedding dimension (columns): ``weight`` ``[num_embeddings, dim]``
and ``p`` ranks, rank ``r`` holds columns ``[r dim / p, (r + 1) dim / p)`` of every row.

Two uses, one layer:

* ``gather_output=False``: the output stays this rank's columns. A table of per-head values
  (T5's relative attention bias, ``[buckets, heads]``) split by heads gives each rank exactly
  its heads' bias, which the attention over those heads adds to its scores. Forward and
  backward send nothing: each rank's gradient is its own columns' gradient.
* ``gather_output=True``: the columns are all-gathered along the last dimension so callers
  see the full embedding (HuggingFace's ``embedding_colwise`` style). Backward keeps this
  rank's chunk of the gradient; nothing crosses the wire.

Either way every rank looks up every id (the rows are not split), so an id out of range fails
as the native embedding does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import group_size
from .mappings import gather_from_tp
from .parallel_module import ParallelModule
from .shard_spec import ShardSpec

__all__ = ["ColumnParallelEmbedding1D"]


class ColumnParallelEmbedding1D(ParallelModule):
    """Embedding with the embedding dimension split over the group (see the module docstring)."""

    def __init__(
        self,
        weight: torch.Tensor,
        spec: ShardSpec,
        process_group=None,
        *,
        padding_idx: int | None = None,
        gather_output: bool = False,
    ) -> None:
        super().__init__(process_group)
        if spec.dim != 1 or spec.is_replicated:
            raise ValueError(f"{type(self).__name__} needs a split (not replicated) spec along dim 1, got {spec}")
        if gather_output and len(spec.segments) != 1:
            raise ValueError(f"{type(self).__name__} gathers one even split only, got {spec}")
        self.num_embeddings = weight.shape[0]
        self.embedding_dim = spec.full_size
        self.spec = spec
        self.padding_idx = padding_idx
        self.gather_output = gather_output
        self._shard_param("weight", weight, spec)

    @classmethod
    def from_native_module(
        cls,
        module: nn.Embedding,
        process_group=None,
        *,
        num_heads: int | None = None,
        gather_output: bool = False,
    ) -> ColumnParallelEmbedding1D:
        """Split ``module``'s columns evenly, or head-wise when ``num_heads`` names how many heads
        the columns hold (each head ``embedding_dim // num_heads`` columns wide)."""
        cls._expect_native(module, nn.Embedding)
        tp, width = group_size(process_group), module.embedding_dim
        if num_heads is None:
            spec = ShardSpec.even(width, tp, dim=1, what=f"embedding_dim of {module}")
        else:
            if width % num_heads:
                raise ValueError(f"embedding_dim={width} of {module} does not hold num_heads={num_heads} equal heads")
            spec = ShardSpec.heads((num_heads,), width // num_heads, tp, dim=1, what=f"heads of {module}")
            if spec.is_replicated:
                raise ValueError(
                    f"{module}: num_heads={num_heads} cannot be split over tensor_parallel_size={tp}; "
                    f"use a tensor_parallel_size that divides {num_heads}"
                )
        return cls(module.weight, spec, process_group, padding_idx=module.padding_idx, gather_output=gather_output)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        y = F.embedding(ids, self.weight, self.padding_idx)
        return gather_from_tp(y, self.process_group, dim=-1) if self.gather_output else y

    def collectives(self) -> dict[str, list[str]]:
        return {"forward": ["all_gather"] if self.gather_output else [], "backward": []}

    def collective_bytes(self, tokens: int, itemsize: int) -> dict[str, list[int]]:
        return {"forward": [tokens * self.spec.local_size * itemsize] if self.gather_output else [], "backward": []}

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim} (rank {self.tp_rank}/{self.tp_size} holds "
            f"{self.spec.local_size} columns), gather_output={self.gather_output}"
        )
