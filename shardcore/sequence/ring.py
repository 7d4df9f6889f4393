"""Ring attention (``sequence_parallelism_mode="ring_attn"``): each rank keeps its queries (two
zigzag chunks of the sequence, for causal balance) and its keys and values; the key/value blocks
travel around the ``sp`` group, one block in hand and the next in flight, and each block's partial
attention is merged into the running result by the log-sum-exp rule. Backward: the same ring,
each block's key/value gradients travelling with it back to their owner. A rank never holds more
than two key/value blocks (its own and the one arriving), not the whole sequence's.
"""

from __future__ import annotations

import functools
import logging

import torch

from ..distributed.collectives import group_rank, group_size
from ..distributed.ring import start_ring_shift
from ..distributed.scope import backward_of
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


def _scores(qg: torch.Tensor, kb: torch.Tensor, mask, scale: float) -> torch.Tensor:
    """Scaled scores of grouped queries ``[B, Hkv, G, Sq, D]`` against one key block
    ``[B, Hkv, Sk, D]`` (grouped-query heads share it: never repeated), with the block's mask."""
    s = (qg @ kb.unsqueeze(2).transpose(-1, -2)) * scale
    if mask is None:
        return s
    if mask.dtype == torch.bool:
        return s.masked_fill(~mask, float("-inf"))
    return s + mask


def _weights(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``exp(s - lse)``, 0 (not NaN) on rows that see no key (``lse`` = -inf)."""
    return torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0).unsqueeze(-1))


def _grouped_mask(mask, heads_kv: int):
    """A mask broadcastable to ``[B, H, Sq, Sk]`` as ``[B, Hkv or 1, G or 1, Sq, Sk]``."""
    if mask is None:
        return None
    if mask.shape[1] == 1:
        return mask.unsqueeze(2)
    return mask.unflatten(1, (heads_kv, mask.shape[1] // heads_kv))


class _RingAttention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v over the whole ring's keys, one key/value block at a time."""

    @staticmethod
    def forward(ctx, q, k, v, mask_of, group, scale):
        heads_kv, world = k.shape[1], group_size(group)
        acc = torch.promote_types(q.dtype, torch.float32)  # accumulate in float32 at least
        qg = q.to(acc).unflatten(1, (heads_kv, q.shape[1] // heads_kv))
        out = torch.zeros_like(qg)
        lse = torch.full(qg.shape[:-1], float("-inf"), dtype=qg.dtype, device=q.device)
        kv = torch.stack([k, v])
        rank = group_rank(group)
        for step in range(world):
            pending = start_ring_shift(kv, group, where="ring attention: keys and values") if step < world - 1 else None
            mask = _grouped_mask(mask_of((rank - step) % world), heads_kv)
            s = _scores(qg, kv[0].to(acc), mask, scale)
            block_lse = torch.logsumexp(s, dim=-1)
            block_out = _weights(s, block_lse) @ kv[1].to(acc).unsqueeze(2)
            merged = torch.logaddexp(lse, block_lse)
            safe = merged.masked_fill(torch.isinf(merged), 0.0)
            out = out * torch.exp(lse - safe).unsqueeze(-1) + block_out * torch.exp(block_lse - safe).unsqueeze(-1)
            lse = merged
            if pending is not None:
                kv = pending.wait()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask_of, ctx.group, ctx.scale, ctx.rank, ctx.world = mask_of, group, scale, rank, world
        ctx.where = backward_of(" (ring attention: key/value gradients)")
        return out.flatten(1, 2).to(q.dtype)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        heads_kv, world, scale = k.shape[1], ctx.world, ctx.scale
        acc = out.dtype
        qg = q.to(acc).unflatten(1, (heads_kv, q.shape[1] // heads_kv))
        dout = grad.to(acc).unflatten(1, (heads_kv, q.shape[1] // heads_kv))
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(qg)
        # the block in hand and its gradients so far, travelling together: [k, v, dk, dv]
        travelling = torch.stack([k.to(acc), v.to(acc), torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)])
        for step in range(world):
            kb, vb = travelling[0], travelling[1]
            mask = _grouped_mask(ctx.mask_of((ctx.rank - step) % world), heads_kv)
            p = _weights(_scores(qg, kb, mask, scale), lse)
            ds = p * (dout @ vb.unsqueeze(2).transpose(-1, -2) - delta)
            dq += (ds @ kb.unsqueeze(2)) * scale
            travelling[2] += (ds.transpose(-1, -2) @ qg).sum(2) * scale
            travelling[3] += (p.transpose(-1, -2) @ dout).sum(2)
            if world > 1:  # after the last step the block goes home with every rank's gradients
                travelling = start_ring_shift(travelling, ctx.group, where=ctx.where).wait()
        return dq.flatten(1, 2).to(q.dtype), travelling[2].to(k.dtype), travelling[3].to(v.dtype), None, None, None


#: attention features the ring does not compute: with them the keys and values are gathered instead
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux")
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
    """What the ring does not compute (attention dropout, sliding windows, soft-capping, sinks):
    the model's own attention over every rank's keys and values, all-gathered along the sequence
    (the backward reduce-scatters their gradients), the mask at global positions."""
    key, value = (gather_seq(t, state.group, 2) for t in (key, value))  # zigzag order, every rank's
    return base(module, query, key, value, _mask_at(module, mask, mine, positions), **kwargs)


def ring_attention(base, *, gather: bool = False):
    """An attention function for a registry that runs ``base``'s attention under ``ring_attn``
    context parallelism: this rank's queries (two zigzag chunks of the sequence) attend to every
    rank's keys and values passed around the ring (:class:`_RingAttention`), with the model's
    mask taken at the queries' and keys' global positions (causal and padding). What the ring does
    not compute (attention dropout in training, sliding windows, soft-capping, sinks) runs
    ``base`` over all-gathered keys and values instead, logged once. ``gather=True``
    (``all_gather_kv``): always that way. Outside an active split ``base`` runs as is."""

    @functools.wraps(base)
    def attention(module, query, key, value, attention_mask, **kwargs):
        state = module.__dict__.get("_shardcore_sequence")
        if state is None or not state.active:
            return base(module, query, key, value, attention_mask, **kwargs)
        state.attention_calls += 1
        group, size = state.group, state.size
        local = query.shape[2]
        positions = zigzag_positions(local * size, size).to(query.device).view(size, local)
        mine = positions[group_rank(group)]
        used = [name for name in _UNSUPPORTED if kwargs.get(name) is not None]
        if module.training and kwargs.get("dropout"):
            used.append("attention dropout")
        if used and not gather:
            reason = f"{type(module).__name__} uses {', '.join(used)}"
            if reason not in _TOLD:
                _TOLD.add(reason)
                _LOG.info("ring_attn: %s, which the ring does not compute: its keys and values are gathered", reason)
        if used or gather:
            return _gathered(base, module, query, key, value, attention_mask, state, mine, positions.flatten(), kwargs)

        def mask_of(block: int):  # built when needed (forward, then backward): never all blocks' at once
            return _mask_at(module, attention_mask, mine, positions[block])

        scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
        out = _RingAttention.apply(query, key, value, mask_of, group, scale)
        return out.transpose(1, 2).contiguous(), None

    return attention
