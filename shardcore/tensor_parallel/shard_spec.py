"""``ShardSpec``: where each rank's slice of a parameter sits in the full tensor.

One description covers every layout the parallel layers use:

* a plain split (column or row parallel): one segment, ``num_shards == tp``;
* a vocabulary padded to ``padded_size`` (rows past ``size`` are zeros and never visible);
* packed projections (fused QKV): several segments, each split on its own, so rank ``r`` holds
  ``[q_r, k_r, v_r]`` rather than a contiguous block of rows;
* attention heads replicated when there are fewer heads than ranks (grouped-query attention with
  few KV heads): a segment with ``num_shards < tp``; rank ``r`` holds shard ``r * num_shards // tp``
  and the ranks holding the same shard form its *replica group*.

The spec can cut a rank's slice out of a full tensor (sharding, checkpoint loading) and put the
full tensor back together from every rank's slice (gradient checks, checkpoint saving).
"""

from __future__ import annotations

import attrs
import torch

from ..distributed.collectives import all_gather_cat

__all__ = ["Segment", "ShardSpec"]


@attrs.frozen
class Segment:
    """A run of ``size`` entries along the split dimension, cut into ``num_shards`` equal shards.

    ``padded_size`` (>= ``size``, divisible by ``num_shards``) is the length after zero padding.
    """

    size: int
    num_shards: int
    padded_size: int

    def __attrs_post_init__(self) -> None:
        if self.padded_size < self.size or self.padded_size % self.num_shards:
            raise ValueError(f"invalid segment {self}: padded_size must be >= size and divisible by num_shards")

    @property
    def shard_len(self) -> int:
        return self.padded_size // self.num_shards


@attrs.frozen
class ShardSpec:
    """How a parameter of a ``tp_size``-way parallel layer is split along ``dim``."""

    dim: int
    tp_size: int
    segments: tuple[Segment, ...]

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def even(cls, size: int, tp_size: int, dim: int = 0, *, what: str = "dimension") -> ShardSpec:
        """Split ``size`` into ``tp_size`` equal parts; ``size`` must divide."""
        if size % tp_size:
            raise ValueError(
                f"{what} of size {size} is not divisible by tensor_parallel_size={tp_size}; "
                f"choose a tensor_parallel_size that divides {size}."
            )
        return cls(dim=dim, tp_size=tp_size, segments=(Segment(size, tp_size, size),))

    @classmethod
    def padded(cls, size: int, tp_size: int, multiple: int, dim: int = 0) -> ShardSpec:
        """Split ``size`` rows after zero-padding to a multiple of ``multiple * tp_size``."""
        step = multiple * tp_size
        return cls(dim=dim, tp_size=tp_size, segments=(Segment(size, tp_size, -(-size // step) * step),))

    @classmethod
    def heads(
        cls, heads: tuple[int, ...], head_dim: int, tp_size: int, dim: int = 0, *, what: str = "heads"
    ) -> ShardSpec:
        """Split packed groups of attention heads (e.g. ``(n_q, n_kv, n_kv)``) head-wise.

        A group whose head count is divisible by ``tp_size`` is split; a group with fewer heads
        than ranks (``tp_size % n == 0``) is replicated, each head on ``tp_size // n`` ranks.
        """
        segments = []
        for n in heads:
            if n % tp_size == 0:
                segments.append(Segment(n * head_dim, tp_size, n * head_dim))
            elif n < tp_size and tp_size % n == 0:
                segments.append(Segment(n * head_dim, n, n * head_dim))
            else:
                raise ValueError(
                    f"{what}: {n} heads cannot be split over tensor_parallel_size={tp_size}; "
                    f"use a tensor_parallel_size that divides {n} (or a multiple of it for key/value heads)."
                )
        return cls(dim=dim, tp_size=tp_size, segments=tuple(segments))

    # ---- geometry -----------------------------------------------------------------------
    @property
    def full_size(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def local_size(self) -> int:
        return sum(s.shard_len for s in self.segments)

    @property
    def is_replicated(self) -> bool:
        return any(s.num_shards < self.tp_size for s in self.segments)

    def shard_index(self, segment: Segment, rank: int) -> int:
        return rank * segment.num_shards // self.tp_size

    def ranges(self, rank: int) -> list[tuple[int, int, int]]:
        """``(start, stop, pad)`` per segment: rows ``[start, stop)`` of the full tensor, then ``pad`` zero rows."""
        out, offset = [], 0
        for seg in self.segments:
            lo = self.shard_index(seg, rank) * seg.shard_len
            hi = min(lo + seg.shard_len, seg.size)
            lo = min(lo, seg.size)
            out.append((offset + lo, offset + hi, seg.shard_len - (hi - lo)))
            offset += seg.size
        return out

    def replica_blocks(self, segment: Segment) -> int:
        """Ranks holding each shard of ``segment`` (1 unless it is replicated)."""
        return self.tp_size // segment.num_shards

    # ---- slicing and gathering ------------------------------------------------------------
    def shard(self, full: torch.Tensor, rank: int) -> torch.Tensor:
        """This rank's slice of ``full`` (a copy, zero padded where the spec pads)."""
        if full.shape[self.dim] != self.full_size:
            raise ValueError(f"expected size {self.full_size} along dim {self.dim}, got shape {tuple(full.shape)}")
        if full.is_meta:  # a paper build (explain, the layout search): the slice's shape, no cat on meta
            shape = list(full.shape)
            shape[self.dim] = self.local_size
            return full.new_empty(shape)
        pieces = []
        for start, stop, pad in self.ranges(rank):
            pieces.append(full.narrow(self.dim, start, stop - start))
            if pad:
                shape = list(full.shape)
                shape[self.dim] = pad
                pieces.append(full.new_zeros(shape))
        return torch.cat(pieces, dim=self.dim).contiguous()

    def unshard(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The full tensor from every rank's slice (``parts[r]`` from rank ``r``)."""
        out = []
        for i, seg in enumerate(self.segments):
            begin = sum(s.shard_len for s in self.segments[:i])
            for shard in range(seg.num_shards):
                first_rank = -(-shard * self.tp_size // seg.num_shards)
                out.append(parts[first_rank].narrow(self.dim, begin, seg.shard_len))
            full_seg = torch.cat(out[-seg.num_shards :], dim=self.dim)
            del out[-seg.num_shards :]
            out.append(full_seg.narrow(self.dim, 0, seg.size))
        return torch.cat(out, dim=self.dim)

    def gather(self, local: torch.Tensor, group) -> torch.Tensor:
        """Collective: the full tensor on every rank of ``group``."""
        stacked = all_gather_cat(local.detach().unsqueeze(0), group, dim=0)
        return self.unshard(list(stacked.unbind(0)))
