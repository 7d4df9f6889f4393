"""A model tensor that a library's checkpoint keeps in pieces (:class:`StackedParts`), read by
:func:`shardcore.load_checkpoint` from its pieces, each rank only those of its slice."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch


@attrs.frozen
class StackedParts:
    """Entry ``i`` of the model tensor along dimension 0 is the concatenation, along ``cat_dim`` of
    the entry, of the checkpoint tensors ``keys[i]``. transformers 5 writes a mixture-of-experts
    layer's fused ``gate_up_proj`` ``[E, 2I, H]`` as ``E`` pairs of ``[I, H]`` tensors (the gate's
    and the up projection's of each expert), its ``down_proj`` as ``E`` single tensors."""

    keys: tuple[tuple[str, ...], ...]
    cat_dim: int = 0

    def all_keys(self) -> list[str]:
        return [key for entry in self.keys for key in entry]

    def full_shape(self, shape_of: Callable[[str], tuple[int, ...]]) -> tuple[int, ...] | None:
        """The stacked tensor's shape from its pieces' shapes; ``None`` when they do not fit together."""
        shapes = [[list(shape_of(k)) for k in entry] for entry in self.keys]
        first = shapes[0]
        if any(len(entry) != len(first) or entry != first for entry in shapes):
            return None  # every entry made of the same pieces
        whole = list(first[0])
        for piece in first[1:]:
            if len(piece) != len(whole) or any(
                a != b for d, (a, b) in enumerate(zip(piece, whole, strict=True)) if d != self.cat_dim
            ):
                return None
            whole[self.cat_dim] += piece[self.cat_dim]
        return (len(self.keys), *whole)

    def renamed(self, rename: Callable[[str], str | None]) -> StackedParts | None:
        """The same pieces under ``rename(key)`` (``None`` when a piece has no such name)."""
        keys = tuple(tuple(rename(k) for k in entry) for entry in self.keys)
        return None if any(k is None for entry in keys for k in entry) else attrs.evolve(self, keys=keys)

    @staticmethod
    def readable(spec) -> bool:
        """Whether a slice under ``spec`` can be read from pieces: whole entries along dim 0."""
        return spec is None or (spec.dim == 0 and len(spec.segments) == 1 and not spec.is_replicated)

    def read(self, read: Callable[[str], torch.Tensor], spec, rank: int) -> torch.Tensor:
        """This rank's slice (``spec`` along dimension 0; ``None``: every entry) from its pieces."""
        if spec is None:
            rows = range(len(self.keys))
        elif not self.readable(spec):
            raise NotImplementedError(
                f"a tensor stacked from checkpoint pieces is read split along dim 0 only ({spec})"
            )
        else:
            start, stop, _ = spec.ranges(rank)[0]
            rows = range(start, stop)
        return torch.stack([torch.cat([read(key) for key in self.keys[i]], dim=self.cat_dim) for i in rows])
