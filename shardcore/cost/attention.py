"""The attention's own rate beside the reference block's: ``calibrate``'s ``attention_shapes``, the cost model's
:func:`multipliers`.

The reference block (:data:`~shardcore.cost.measure.BLOCK`) attends without a mask at a head dim of 64. A model's
attention may be causal, and its heads narrower or wider. The FLOPs counted for a causal attention are half the
full one's, but a CPU's fused kernel runs about the full one's work (it skips little of the masked half): per counted
FLOP, causal attention measured 0.45-0.55x the unmasked one's rate on one core here, a head dim of 32 0.85-0.9x 64's.
A GPU's flash kernel skips the masked blocks, its factor near 1. So the rate is measured, per dtype: scaled dot
product attention's forward and backward at each of :data:`HEAD_DIMS`, masked and not, and the reference block's own
attention, each over the reference block's rate (on this project's CPUs the reference attention runs at 0.7 of it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .curves import interpolate

#: the head dims the attention is timed at (heads x dim: the reference block's width), on sequences of :data:`SEQ`
HEAD_DIMS, SEQ = (32, 64, 128), 512


def step_flops(batch: int, heads: int, seq: int, dim: int, causal: bool) -> float:
    """The FLOPs the cost model counts for an attention's forward and backward: 3 x 4 x ``seq`` x ``heads x dim`` a
    token (the scores and their weighted sum), half of it when causal."""
    return 3 * 4 * batch * seq * seq * heads * dim * (0.5 if causal else 1.0)


def calls(device: torch.device, dtype: torch.dtype, width: int, reference: tuple[int, int, int]) -> dict:
    """``{key: (call, flops)}``: an attention's forward and backward at each of :data:`HEAD_DIMS` (``width // dim``
    heads, one sequence of :data:`SEQ`), masked (``("causal", dim)``) and not (``("full", dim)``), and at the
    reference block's own (``"reference"``: ``(sequences, tokens, head dim)``, unmasked)."""

    def call(batch: int, heads: int, seq: int, dim: int, causal: bool) -> tuple[Callable[[], None], float]:
        q, k, v = (torch.randn(batch, heads, seq, dim, device=device, dtype=dtype, requires_grad=True) for _ in "qkv")

        def run() -> None:
            q.grad = k.grad = v.grad = None  # each gradient written anew, as a model's step writes it
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

        return run, step_flops(batch, heads, seq, dim, causal)

    out = {
        (mask, dim): call(1, width // dim, SEQ, dim, mask == "causal")
        for mask in ("full", "causal")
        for dim in HEAD_DIMS
    }
    batch, seq, dim = reference
    out["reference"] = call(batch, width // dim, seq, dim, False)
    return out


def factors(rates: dict, block_rate: float, share: float) -> dict:
    """``{"full" | "causal": {head dim: factor}, "reference": factor, "share": share}``: each measured rate (FLOP/s,
    keyed as :func:`calls`) over the reference block's ``block_rate``, and ``share``, the attention's part of the
    reference block's FLOPs (how much of the block's rate the reference attention's own factor accounts for)."""
    out: dict = {"full": {}, "causal": {}, "reference": rates["reference"] / block_rate, "share": share}
    for key, rate in rates.items():
        if key != "reference":
            out[key[0]][str(key[1])] = rate / block_rate
    return out


def measure(device: torch.device, dtype: torch.dtype, together: Callable, block: tuple, block_rate: float) -> dict:
    """:func:`factors` of :func:`calls`, each timed by ``together`` (every rank at once: calibrate's timing) beside
    the reference ``block`` (``(width, heads, sequences, tokens, its step's FLOPs)``) run at ``block_rate``."""
    width, heads, batch, seq, block_flops = block
    made = calls(device, dtype, width, (batch, seq, width // heads))
    rates = {key: flops / together(fn, device) for key, (fn, flops) in made.items()}
    return factors(rates, block_rate, made["reference"][1] / block_flops)


def multipliers(entry: dict, dtype: str, dim: int, causal: bool) -> tuple[float, float]:
    """``(attention, rest)``: seconds per counted FLOP of a model's attention, and of the rest of its blocks, over the
    reference block's (``entry`` a rank's figures in the profile). The attention's: 1 over its rate's factor,
    log-linear in the head dim between the measured ones, the nearest outside them. The rest's: the block's
    seconds less its own attention's, over its other FLOPs (a CPU's attention runs slower than its matmuls, so the
    rest runs a little faster than the block as a whole). ``(1, 1)`` where the profile has no attention shapes
    (calibrated before they were measured) or the model no attention."""
    shapes = entry.get("attention_shapes")
    if not shapes or dim <= 0:
        return 1.0, 1.0
    table = shapes.get(dtype) or next(iter(shapes.values()))
    by_dim = table["causal" if causal else "full"]
    own = interpolate(sorted((math.log(int(d)), f) for d, f in by_dim.items()), math.log(dim))
    share = table["share"]
    return 1.0 / own, (1.0 - share / table["reference"]) / (1.0 - share)
