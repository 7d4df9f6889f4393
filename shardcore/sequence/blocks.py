"""One piece of ring attention: this rank's queries (or a chunk of them) against one key/value
block (or a chunk of it), forward with its log-sum-exp and backward given the merged output and
log-sum-exp, and the rule that merges the pieces.

On CPU the pieces run PyTorch's fused flash-attention kernel
(``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward: the kernel
``scaled_dot_product_attention`` itself picks there; grouped key/value heads are read as they
are, never repeated, and no score matrix is kept); on other devices the same arithmetic is
written out in float32 (exact, but it holds one piece's score matrix).

Under a causal mask with no other mask (a decoder without padding), the zigzag layout lets a
block be cut into its chunks (:func:`pieces`): each query chunk sees an earlier key chunk whole,
its own chunk causally, and a later one not at all, so no mask is built and half of the work,
the chunks no query sees, is skipped.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FUSED_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


class Piece(NamedTuple):
    """Which of this rank's query rows attend to which of the block's key columns, and how."""

    rows: slice
    cols: slice
    mask: torch.Tensor | None  # the model's mask there (bool or additive), broadcastable to [B, H, rows, cols]
    causal: bool  # a square diagonal chunk: row i sees columns <= i


def pieces(mask_of, block: int, rank: int, world: int, local: int, causal_only: bool) -> list[Piece]:
    """The pieces of this rank's attention to ``block``'s keys. ``causal_only``: the model's mask
    is the causal rule alone, cut by zigzag chunks (rank ``r`` holds chunks ``r`` and
    ``2 * world - 1 - r``, each ``local // 2`` tokens); else one piece with ``mask_of(block)``."""
    if not causal_only:
        return [Piece(slice(None), slice(None), mask_of(block), False)]
    half, found = local // 2, []
    for i, mine in enumerate((rank, 2 * world - 1 - rank)):
        for j, theirs in enumerate((block, 2 * world - 1 - block)):
            if theirs <= mine:  # a later chunk is never seen
                found.append(
                    Piece(slice(i * half, (i + 1) * half), slice(j * half, (j + 1) * half), None, theirs == mine)
                )
    return found


def _fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the fused CPU kernel runs the piece: it takes values as wide as the keys only (MLA's are narrower)."""
    return _FUSED is not None and q.device.type == "cpu" and k.shape[-1] == v.shape[-1]


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return None if mask is None else mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def _sees_nothing(mask: torch.Tensor) -> torch.Tensor:
    """Rows of ``mask`` with no visible key, ``[B, 1 or H, rows]``."""
    return ~mask.any(-1) if mask.dtype == torch.bool else (mask == float("-inf")).all(-1)


def _math_mask(piece: Piece, rows: int, cols: int, device) -> torch.Tensor | None:
    if piece.causal:
        return torch.ones(rows, cols, dtype=torch.bool, device=device).tril()
    return piece.mask


def _grouped(t: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """``[B, H, ...]`` as ``[B, Hkv or 1, G or 1, ...]`` (grouped-query heads share a key head)."""
    if t.dim() == 2:  # a [rows, cols] mask
        return t
    if t.shape[1] == 1:
        return t.unsqueeze(2)
    return t.unflatten(1, (heads_kv, t.shape[1] // heads_kv))


def _math_scores(q, k, mask, scale):
    s = (q @ k.unsqueeze(2).transpose(-1, -2)) * scale
    if mask is None:
        return s
    return s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask


def _exp_minus(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``exp(s - lse)``, 0 (not NaN) on rows that see no key (``lse`` = -inf)."""
    return torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0).unsqueeze(-1))


def attend(q, k, v, piece: Piece, scale: float, acc: torch.dtype):
    """The piece's attention output (``acc`` dtype) and log-sum-exp (``-inf`` on a row that sees
    no key of the piece)."""
    q, k, v = q[:, :, piece.rows], k[:, :, piece.cols], v[:, :, piece.cols]
    if _fused(q, k, v):
        out, lse = _FUSED(q, k, v, 0.0, piece.causal, attn_mask=_additive(piece.mask, q.dtype), scale=scale)
        out, lse = out.to(acc), lse.to(acc)
    else:
        heads_kv = k.shape[1]
        mask = _math_mask(piece, q.shape[2], k.shape[2], q.device)
        s = _math_scores(
            _grouped(q.to(acc), heads_kv), k.to(acc), None if mask is None else _grouped(mask, heads_kv), scale
        )
        lse = torch.logsumexp(s, dim=-1)
        out = (_exp_minus(s, lse) @ v.to(acc).unsqueeze(2)).flatten(1, 2)
        lse = lse.flatten(1, 2)
    if piece.mask is not None:
        lse = lse.masked_fill(_sees_nothing(piece.mask), float("-inf"))
    return out, lse


def merge(out: torch.Tensor, lse: torch.Tensor, rows: slice, piece_out: torch.Tensor, piece_lse: torch.Tensor) -> None:
    """Merge a piece's output and log-sum-exp into the running ``out`` / ``lse`` rows, in place."""
    now_out, now_lse = out[:, :, rows], lse[:, :, rows]
    merged = torch.logaddexp(now_lse, piece_lse)
    safe = merged.masked_fill(torch.isinf(merged), 0.0)
    out[:, :, rows] = now_out * torch.exp(now_lse - safe).unsqueeze(-1) + piece_out * torch.exp(
        piece_lse - safe
    ).unsqueeze(-1)
    lse[:, :, rows] = merged


def attend_backward(dout, q, k, v, out, lse, piece: Piece, scale: float):
    """The piece's share of the query, key and value gradients, given the merged output and
    log-sum-exp of every key (so its probabilities are the full softmax's)."""
    dout, q, out, lse = (t[:, :, piece.rows] for t in (dout, q, out, lse))
    k, v = k[:, :, piece.cols], v[:, :, piece.cols]
    lse = lse.masked_fill(torch.isinf(lse), 0.0)  # a row that sees no key: its probabilities are 0
    if _fused(q, k, v):
        dtype = q.dtype
        return _FUSED_BACKWARD(
            dout.to(dtype),
            q,
            k.to(dtype),
            v.to(dtype),
            out.to(dtype),
            lse.to(torch.promote_types(dtype, torch.float32)),
            0.0,
            piece.causal,
            attn_mask=_additive(piece.mask, dtype),
            scale=scale,
        )
    acc, heads_kv = out.dtype, k.shape[1]
    qg, dg, og = (_grouped(t.to(acc), heads_kv) for t in (q, dout, out))
    kb, vb = k.to(acc), v.to(acc)
    mask = _math_mask(piece, q.shape[2], k.shape[2], q.device)
    p = _exp_minus(
        _math_scores(qg, kb, None if mask is None else _grouped(mask, heads_kv), scale), _grouped(lse, heads_kv)
    )
    ds = p * (dg @ vb.unsqueeze(2).transpose(-1, -2) - (dg * og).sum(-1, keepdim=True))
    dq = (ds @ kb.unsqueeze(2)).flatten(1, 2) * scale
    return dq, (ds.transpose(-1, -2) @ qg).sum(2) * scale, (p.transpose(-1, -2) @ dg).sum(2)
