"""What ``shardcore explain`` adds for the modes that run over the ``sp`` dim (``all_to_all``,
``ring_attn``, ``all_gather_kv``): their collectives per block and outside the blocks, and, given
a sequence length, the attention keys and values each rank holds and sends per layer."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..config import OVER_SP_MODES
from ..sequence import heads_of


def per_attention(mode: str, sp: int) -> tuple[dict[str, int], dict[str, int]]:
    """The collectives one attention issues under ``mode`` (forward, backward)."""
    if mode == "ring_attn":  # sp - 1 shifts bring every other block; sp take the gradients home
        return {"ring_shift": sp - 1}, {"ring_shift": sp}
    if mode == "all_gather_kv":  # keys and values gathered; their gradients reduce-scattered
        return {"all_gather": 2}, {"reduce_scatter": 2}
    return {"all_to_all": 4}, {"all_to_all": 4}  # Ulysses: query, key, value in, output out


def add_sequence_counts(build, blocks, block_cls: dict[str, str], per_block, outside, step) -> None:
    """Add the ``sp``-dim collectives of ``build`` (one attention per block, as the split itself
    checks) to explain's counts, in place: per attention, the mode's; per block parameter, the
    all-reduce over ``sp`` of its gradient (each rank's tokens only); outside, the all-gather of
    the sequence after the last block and, in the backward, of its gradient at the first."""
    mode, sp = build.sequence_mode, build.layout.sp
    if mode not in OVER_SP_MODES or sp == 1:
        return
    forward, backward = per_attention(mode, sp)
    shown: set[str] = set()
    for name, block in blocks:
        grads = sum(1 for p in block.parameters() if p.requires_grad)
        add = {"forward": Counter(forward), "backward": Counter({**backward, "all_reduce": grads})}
        if block_cls[name] not in shown:  # per class: the first block's, as for tensor parallelism
            shown.add(block_cls[name])
            target = per_block.setdefault(block_cls[name], {"forward": Counter(), "backward": Counter()})
            for phase in add:
                target[phase].update(add[phase])
        for phase in add:
            step[phase].update(add[phase])
    for counts in (outside, step):
        counts["forward"]["all_gather"] += 1
        counts["backward"]["all_gather"] += 1
        if build.config.check_inputs == "always":  # the same batch on the sp ranks, every forward
            counts["forward"]["all_gather"] += 1
    for counts in (outside, step, *per_block.values()):
        for phase in counts:
            counts[phase] = Counter({k: n for k, n in counts[phase].items() if n})


def _head_dim(model, heads: int) -> int | None:
    cfg = getattr(model, "config", None)
    dim = getattr(cfg, "head_dim", None)
    hidden = getattr(cfg, "hidden_size", None)
    return dim if isinstance(dim, int) else (hidden // heads if isinstance(hidden, int) and heads else None)


def sequence_bytes(build, seq: int, batch: int, itemsize: int) -> dict[str, Any] | None:
    """Per rank at ``seq`` tokens x ``batch``: the attention keys and values each layer keeps for
    the backward (``kv_bytes_kept_per_layer``: every layer's, all at once), the most one layer has
    in hand at a time (``kv_bytes_in_flight``: the ring's blocks travelling, the gathered sequence),
    and what a layer sends (forward, backward). ``None`` when the mode is not over ``sp`` or the
    attention's shape is unknown."""
    mode, sp, tp = build.sequence_mode, build.layout.sp, build.layout.tp if build.tensor_parallel else 1
    if mode not in OVER_SP_MODES or sp == 1:
        return None
    heads, heads_kv = heads_of(build.policy)
    dim = _head_dim(build.model, heads)
    if dim is None:
        return None
    kv_block = batch * max(1, heads_kv // tp) * (seq // sp) * dim * itemsize  # one rank's keys (or values)
    widen = max(itemsize, 4) // itemsize  # the ring's backward travels in float32 at least
    if mode == "ring_attn":
        kept = 2 * kv_block  # its own keys and values
        flight = 2 * 4 * kv_block * widen  # backward: [k, v, dk, dv] in hand and arriving
        sent = {"forward": (sp - 1) * 2 * kv_block, "backward": sp * 4 * kv_block * widen}
    elif mode == "all_gather_kv":
        kept = flight = 2 * sp * kv_block  # every rank's keys and values
        sent = {"forward": 2 * (sp - 1) * kv_block, "backward": 2 * (sp - 1) * kv_block}
    else:
        q_block = batch * max(1, heads // tp) * (seq // sp) * dim * itemsize
        kept = flight = 2 * kv_block  # keys and values of heads / sp over the whole sequence
        sent = {phase: (sp - 1) * (2 * q_block + 2 * kv_block) // sp for phase in ("forward", "backward")}
    return {
        "mode": mode,
        "seq": seq,
        "batch": batch,
        "head_dim": dim,
        "kv_bytes_kept_per_layer": kept,
        "kv_bytes_in_flight": flight,
        "bytes_sent_per_layer": sent,
    }
