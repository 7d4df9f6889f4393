"""The cost model's price of a rank's elementwise work (traced by :mod:`shardcore.cost.elementwise`): its bytes at the
profile's measured rate, less the reference block's share, which that block's measured rate already holds."""

from __future__ import annotations

import functools

import torch

from .curves import at_size
from .elementwise import count
from .measure import BLOCK, SHAPE_TP, _RankBlock, block_step_flops


@functools.lru_cache(maxsize=64)
def reference(tp: int, tokens: int) -> tuple[int, int, float]:
    """``(ops, bytes, FLOPs)`` of the reference block's forward and backward (``calibrate``'s, a rank's share under
    TP=``tp``) on a microbatch of ``tokens`` tokens (sequences of at most the reference's length), traced."""
    width, _, ffn, _, length = BLOCK
    length = min(tokens, length)
    with torch.device("meta"):
        block, x = _RankBlock(tp), torch.empty(max(tokens // length, 1), length, width, requires_grad=True)
    c = count(lambda: block(x).sum().backward(), width, 1)  # every tensor counted, none per call
    return c.ops, c.whole + c.split + c.fixed, block_step_flops(width, ffn, tokens, length) / tp


def excess_seconds(entry: dict, traced: dict | None, *, tokens: int, tp: int, calls: int, share: float, flops: float):
    """Seconds a rank spends on elementwise work beyond what its FLOPs at the reference block's rate hold (``entry``:
    the rank's profile figures, ``traced``: :func:`trace`): ``share`` of the model's traced bytes (its stage's), for
    ``calls`` microbatches of ``tokens`` tokens each, the residual stream's tensors whole under TP=``tp`` and the rest
    split, at the profile's rate for their bytes per op; less ``flops`` (the rank's forward and backward) at the
    reference block's elementwise seconds per FLOP on the same microbatch (at the largest measured TP degree not
    above ``tp``, as its rate is read). Negative for a model wider than the reference. 0 without a trace or a rate
    (a profile calibrated before it)."""
    rates = entry.get("elementwise_bytes_per_s")
    if not traced or not rates:
        return 0.0
    per_call = (traced["whole"] + traced["split"] / tp) * tokens / traced["tokens"] + traced["fixed"] / tp
    mine = calls * share * per_call / at_size(rates, per_call / max(traced["ops"], 1))
    ops, nbytes, ref_flops = reference(max(t for t in SHAPE_TP if t <= tp), tokens)
    return mine - flops * nbytes / at_size(rates, nbytes / ops) / ref_flops
