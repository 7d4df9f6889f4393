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

    def read(self, read_rows: Callable, shape_of: Callable, spec, rank: int, dtype: torch.dtype) -> torch.Tensor:
        """This rank's slice under ``spec`` (``None``: all of it), read from the pieces it covers only.

        Split along dimension 0: this rank's entries (experts). Along another dimension: that part of
        every entry, from each piece the part covers (a packed column split of a fused ``gate_up_proj``
        reads a slice of the gate's rows and one of the up projection's). ``read_rows(key, dim, ranges)``
        reads rows of one piece (:meth:`SafetensorsFile.read_rows
        <shardcore.checkpoint.safetensors_io.SafetensorsFile.read_rows>`), ``shape_of(key)`` its shape."""
        shape = list(self.full_shape(shape_of))
        dim, ranges = (0, [(0, shape[0], 0)]) if spec is None else (spec.dim, spec.ranges(rank))
        shape[dim] = sum(stop - start + pad for start, stop, pad in ranges)
        out, at = torch.zeros(shape, dtype=dtype), 0  # zeros: the padding rows
        for start, stop, pad in ranges:
            if dim == 0:
                for i in range(start, stop):
                    out[at + i - start] = self._entry(i, read_rows, shape_of, dtype)
            elif stop > start:
                for i in range(len(self.keys)):
                    part = self._entry(i, read_rows, shape_of, dtype, dim - 1, (start, stop))
                    out[i].narrow(dim - 1, at, stop - start).copy_(part)
            at += stop - start + pad
        return out

    def _entry(self, i: int, read_rows, shape_of, dtype, dim: int = 0, span: tuple[int, int] | None = None):
        """Entry ``i``, or its rows ``span`` along ``dim``, from its pieces (each read for what it covers)."""
        parts, offset = [], 0
        for key in self.keys[i]:
            size = shape_of(key)[self.cat_dim]
            if span is None:
                parts.append(read_rows(key, 0, [(0, shape_of(key)[0], 0)], dtype))
            elif dim != self.cat_dim:  # the same rows of every piece, side by side
                parts.append(read_rows(key, dim, [(*span, 0)], dtype))
            elif max(span[0], offset) < min(span[1], offset + size):  # the rows of the run in this piece
                lo, hi = max(span[0], offset), min(span[1], offset + size)
                parts.append(read_rows(key, dim, [(lo - offset, hi - offset, 0)], dtype))
            offset += size
        return torch.cat(parts, dim=self.cat_dim)
