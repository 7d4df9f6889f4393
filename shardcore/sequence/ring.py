"""Ring attention (``sequence_parallelism_mode="ring_attn"``): each rank keeps its queries (two
zigzag chunks of the sequence, for causal balance; a bidirectional model's one contiguous part)
and its keys and values; the key/value blocks
travel around the ``sp`` group, one block in hand and the next in flight, and each block's partial
attention is merged into the running result by the log-sum-exp rule. Backward: the same ring,
each block's key/value gradients travelling with it back to their owner. A rank holds a few
blocks' worth of keys and values at a time (its own, kept for the backward; the one in hand and
the one arriving; in the backward both with their gradients, in float32), never the whole
sequence's.
"""

from __future__ import annotations

import functools
import logging

import torch

from ..distributed.collectives import group_rank, group_size
from ..distributed.ring import start_ring_shift
from ..distributed.scope import backward_of
from ..tensor_parallel.regions import gather_seq
from .blocks import attend, attend_backward, merge, pieces
from .check import refuse_cached_keys


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


def ring_positions(length: int, size: int, zigzag: bool) -> torch.Tensor:
    """The global position of each token in the ring's order: zigzag (a causal model), or the
    sequence as it is (a bidirectional one, split in contiguous parts)."""
    return zigzag_positions(length, size) if zigzag else torch.arange(length)


def _widths(message: torch.Tensor, *like: torch.Tensor) -> list[torch.Tensor]:
    """The tensors ``message`` carries side by side along its last dim, each as wide as its ``like``
    (views: a gradient added to one lands in the message)."""
    return list(message.split([t.shape[-1] for t in like], dim=-1))


class _RingAttention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v over the whole ring's keys, one key/value block at a time,
    each block in :func:`~.blocks.pieces` (``mask_of(block)``: the model's mask for it;
    ``causal_only``: the causal rule alone, cut by zigzag chunks)."""

    @staticmethod
    def forward(ctx, q, k, v, mask_of, causal_only, group, scale):
        world, rank, local = group_size(group), group_rank(group), q.shape[2]
        acc = torch.promote_types(q.dtype, torch.float32)  # merge in float32 at least
        out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=acc, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        kv = torch.cat([k, v], dim=-1)  # one message; MLA's values are narrower than its keys
        for step in range(world):
            pending = start_ring_shift(kv, group, where="ring attention: keys and values") if step < world - 1 else None
            for piece in pieces(mask_of, (rank - step) % world, rank, world, local, causal_only):
                merge(out, lse, piece.rows, *attend(q, *_widths(kv, k, v), piece, scale, acc))
            if pending is not None:
                kv = pending.wait()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask_of, ctx.causal_only, ctx.group, ctx.scale = mask_of, causal_only, group, scale
        ctx.rank, ctx.world = rank, world
        ctx.where = backward_of(" (ring attention: key/value gradients)")
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        world, acc = ctx.world, out.dtype
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        # the block in hand and its gradients so far, travelling together: [k, v, dk, dv] along the last dim
        zeros = torch.zeros((*k.shape[:-1], k.shape[-1] + v.shape[-1]), dtype=acc, device=k.device)
        travelling = torch.cat([k.to(acc), v.to(acc), zeros], dim=-1)
        for step in range(world):
            block = (ctx.rank - step) % world
            bk, bv, dk, dv = _widths(travelling, k, v, k, v)
            for piece in pieces(ctx.mask_of, block, ctx.rank, world, q.shape[2], ctx.causal_only):
                dq_piece, dk_piece, dv_piece = attend_backward(grad, q, bk, bv, out, lse, piece, ctx.scale)
                dq[:, :, piece.rows] += dq_piece
                dk[:, :, piece.cols] += dk_piece
                dv[:, :, piece.cols] += dv_piece
            if world > 1:  # after the last step the block goes home with every rank's gradients
                travelling = start_ring_shift(travelling, ctx.group, where=ctx.where).wait()
        _, _, dk, dv = _widths(travelling, k, v, k, v)
        grads = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype))
        return (*grads, None, None, None, None)


#: attention features the ring does not compute: with one of them passed, the keys and values are gathered instead
GATHERED_FOR = ("sliding_window", "softcap", "s_aux")
_LOG = logging.getLogger("shardcore")
_TOLD: set[str] = set()


def _mask_at(module, mask, mine: torch.Tensor, theirs: torch.Tensor):
    """The model's mask for queries at global positions ``mine`` against keys at ``theirs``: the
    causal rule when the model gives none and is causal, else its mask at those positions (``None``:
    a bidirectional model without padding sees every key)."""
    if mask is None and getattr(module, "is_causal", True):
        return theirs[None, None, None, :] <= mine[None, None, :, None]
    if mask is None:
        return None
    return mask[:, :, mine][:, :, :, theirs]


def _gathered(base, module, query, key, value, mask, state, mine, positions, kwargs):
    """What the ring does not compute (attention dropout, sliding windows, soft-capping, sinks, a mask with a
    gradient):
    the model's own attention over every rank's keys and values, all-gathered along the sequence
    (the backward reduce-scatters their gradients), the mask at global positions."""
    key, value = (gather_seq(t, state.group, 2) for t in (key, value))  # zigzag order, every rank's
    return base(module, query, key, value, _mask_at(module, mask, mine, positions), **kwargs)


def ring_attention(base, *, gather: bool = False):
    """An attention function for a registry that runs ``base``'s attention under ``ring_attn``
    context parallelism: this rank's queries (two zigzag chunks of the sequence) attend to every
    rank's keys and values passed around the ring (:class:`_RingAttention`), with the model's
    mask taken at the queries' and keys' global positions (causal and padding). What the ring does
    not compute (attention dropout in training, sliding windows, soft-capping, sinks, a mask with a
    gradient: its kernel holds the mask constant) runs
    ``base`` over all-gathered keys and values instead, logged once. ``gather=True``
    (``all_gather_kv``): always that way. Outside an active split ``base`` runs as is."""

    @functools.wraps(base)
    def attention(module, query, key, value, attention_mask, **kwargs):
        state = module.__dict__.get("_shardcore_sequence")
        if state is None or not state.active:
            return base(module, query, key, value, attention_mask, **kwargs)
        refuse_cached_keys(module, query, key, state)
        state.attention_calls += 1
        group, size = state.group, state.size
        local = query.shape[2]
        positions = ring_positions(local * size, size, state.zigzag).to(query.device).view(size, local)
        mine = positions[group_rank(group)]
        used = [name for name in GATHERED_FOR if kwargs.get(name) is not None]
        if module.training and kwargs.get("dropout"):
            used.append("attention dropout")
        if isinstance(attention_mask, torch.Tensor) and attention_mask.requires_grad:  # Doge's dynamic mask
            used.append("a mask with a gradient")
        if used and not gather:
            reason = f"{type(module).__name__} uses {', '.join(used)}"
            if reason not in _TOLD:
                _TOLD.add(reason)
                _LOG.info("ring_attn: %s, which the ring does not compute: its keys and values are gathered", reason)
        if used or gather:
            return _gathered(base, module, query, key, value, attention_mask, state, mine, positions.flatten(), kwargs)

        def mask_of(block: int):  # built when needed (forward, then backward): never all blocks' at once
            return _mask_at(module, attention_mask, mine, positions[block])

        # the causal rule alone, cut by zigzag chunks (a contiguous split takes the rule from positions)
        causal_only = attention_mask is None and getattr(module, "is_causal", True) and state.zigzag
        scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
        out = _RingAttention.apply(query, key, value, mask_of, causal_only, group, scale)
        return out.transpose(1, 2).contiguous(), None

    return attention
