"""Ring attention (``sequence_parallelism_mode="ring_attn"``): each rank's queries, two zigzag
chunks of the sequence for causal balance, attend to all-gathered keys and values.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ..tensor_parallel.regions import gather_seq


def _zigzag(t: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """The sequence's ``2 * size`` chunks reordered so that rank ``r``'s equal part is chunks ``r``
    and ``2 * size - 1 - r``: under a causal mask every rank then has the same work."""
    chunks = t.chunk(2 * size, dim=dim)
    return torch.cat([c for r in range(size) for c in (chunks[r], chunks[2 * size - 1 - r])], dim=dim)


def _unzigzag(t: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """The inverse of :func:`_zigzag`."""
    chunks = t.chunk(2 * size, dim=dim)
    order = [None] * (2 * size)
    for r in range(size):
        order[r], order[2 * size - 1 - r] = chunks[2 * r], chunks[2 * r + 1]
    return torch.cat(order, dim=dim)


def zigzag_positions(length: int, size: int) -> torch.Tensor:
    """The global position of each token in the zigzag order (rank ``r``'s part is the ``r``-th of
    ``size`` equal slices of the result)."""
    return _zigzag(torch.arange(length), size, 0)


def ring_attention(base):
    """An attention function for a registry that runs ``base`` under ``ring_attn`` context
    parallelism: this rank's queries (two zigzag chunks of the sequence) attend to every key and
    value, all-gathered along the sequence (backward: their gradients reduce-scattered), with the
    model's mask taken at the queries' and keys' global positions (causal and padding)."""

    @functools.wraps(base)
    def attention(module, query, key, value, attention_mask, **kwargs):
        state = module.__dict__.get("_shardcore_sequence")
        if state is None or not state.active:
            return base(module, query, key, value, attention_mask, **kwargs)
        state.attention_calls += 1
        group, rank = state.group, dist.get_group_rank(state.group, dist.get_rank())
        key, value = (gather_seq(t, group, 2) for t in (key, value))  # zigzag order, every rank's keys
        local = query.shape[2]
        positions = zigzag_positions(local * state.size, state.size).to(query.device)
        mine = positions[rank * local : (rank + 1) * local]
        if attention_mask is None and getattr(module, "is_causal", True):  # causal, at global positions
            attention_mask = positions[None, None, None, :] <= mine[None, None, :, None]
        elif attention_mask is not None:  # (None on a bidirectional model: every key, no mask)
            attention_mask = attention_mask[:, :, mine][:, :, :, positions]
        return base(module, query, key, value, attention_mask, **kwargs)

    return attention
