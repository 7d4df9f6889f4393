"""The cost model: a layout's predicted step time and memory per rank, from what ``explain`` counts on paper
(:mod:`shardcore.cost.facts`) and this machine's profile (``shardcore calibrate``).

A training step on ``batch`` sequences of ``seq`` tokens (the global batch) costs, on the slowest rank (the largest
pipeline stage):

* **compute**: ``3 x`` the forward FLOPs (the backward does twice the forward's) of the stage's tokens (``batch /
  dp`` sequences, ``seq / sp`` tokens each): 2 per matmul weight per token, 4 x ``seq x heads x head_dim`` per
  attention layer (half for a causal model), over the profile's per-rank ``block_flops`` (a reference block's
  FLOP/s, its norms and softmax included) scaled by ``block_shapes`` to the rank's microbatch (its tokens, its share
  of the heads and MLP under TP: small matmuls run slower), an expert's matmuls at the rate of the rows it gets
  (:func:`expert_factor`), the attention's FLOPs at the rate measured for its head dim, masked or not, and the rest
  at the block's rate less its own attention's part (:func:`~shardcore.cost.attention.multipliers`); plus the loss
  over the float32 logits, at the rate measured for each call's size (under TP
  with the logits gathered, the whole vocabulary on every rank) at the profile's cross-entropy rate
  (:func:`loss_seconds`); plus the model's elementwise work (traced) beyond the reference block's share of it
  (:func:`~shardcore.cost.excess.excess_seconds`), each stage its share;
* **pipeline bubble**: 1F1B over ``M`` microbatches of one sequence each, run microbatch by microbatch
  (:func:`~shardcore.cost.schedule.one_f_one_b`): uniform stages on their own devices take ``M + P - 1`` slots, a
  heavy last stage (the head, the loss) waits on the others' single slots only; where ranks share the devices (a
  CPU's cores) the ranks with work share them, an idle one's share going to the others;
* **optimizer step**: each parameter tensor the rank updates (FSDP: its shard) at the profile's rate for that
  tensor's size (:func:`optimizer_seconds`);
* **communication**, never assumed overlapped: per kind and group, ``count x latency + bytes / bandwidth`` from the
  profile's line fits (:func:`collective_seconds`), for the tensor-parallel collectives (explain's counts and bytes,
  per microbatch), the sequence-parallel attention traffic and gradient all-reduce, the data-parallel gradient sync
  (DDP: all-reduce in 25 MB buckets, a pipeline stage's in one with its flat gradients written anew and copied
  back; FSDP: each block's parameters all-gathered forward and backward, gradients reduce-scattered from a flat
  buffer written anew, :func:`fresh_seconds`), the pipeline boundaries (one swap per microbatch each way), the
  experts' dispatch.

Memory per rank: :func:`~shardcore.cost.memory.memory_per_rank`.
"""

from __future__ import annotations

import math
from typing import Any

from .attention import multipliers as attention_multipliers
from .curves import at_size
from .curves import interpolate as _interpolate
from .excess import excess_seconds
from .facts import StageFacts
from .memory import OPTIMIZER_STATES, dp_shard, memory_per_rank
from .schedule import one_f_one_b

DDP_BUCKET_BYTES = 25 * 2**20
#: passes over the float32 logits the loss makes (log-softmax forward, its gradient, the upcast): its price in a
#: profile without ``loss_elements_per_s`` (:func:`loss_seconds`)
LOSS_PASSES = 6


def _nearest(table: dict[str, Any], group: int) -> tuple[int, Any]:
    sizes = sorted(int(k) for k in table if "@" not in k)
    below = [s for s in sizes if s <= group]
    size = below[-1] if below else sizes[0]
    return size, table[str(size)]


def collective_seconds(
    profile: dict, kind: str, group: int, count: float, nbytes: float, world: int | None = None
) -> float:
    """``count`` collectives of ``kind`` over ``group`` ranks putting ``nbytes`` in all (each rank's
    contribution), in a job of ``world`` ranks. Where the profile measured that group in that world
    (or as the whole world), each call's seconds are read off the measured points (linear between
    them, along the last two beyond them: large messages leave the CPU's caches, which one line
    through every point would miss); else the line fit at the nearest measured group size, a
    ring's ``(g-1)`` steps scaled to ``group``."""
    if group <= 1 or count <= 0:
        return 0.0
    if kind == "send_recv":
        return count * _per_call(_nearest(profile["per_rank"], world or group)[1]["send_recv"], nbytes / count)
    table = profile["collectives"][kind]
    exact = table.get(f"{group}@{world}") or (table.get(str(group)) if world in (None, group) else None)
    if exact is not None:
        return count * _per_call(exact, nbytes / count)
    size, fit = _nearest(table, group)
    scale_lat = (group - 1) / max(size - 1, 1)
    scale_bw = ((group - 1) / group) / ((size - 1) / size)
    return count * fit["latency_s"] * scale_lat + nbytes / fit["bytes_per_s"] * scale_bw


def _per_call(fit: dict, nbytes: float) -> float:
    """Seconds of one call putting ``nbytes``: the measured points interpolated (the line fit
    where a profile holds no points)."""
    points = sorted(fit.get("points") or [])
    if len(points) < 2:
        return fit["latency_s"] + nbytes / fit["bytes_per_s"]
    return _interpolate(points, nbytes, extend=True)


def per_rank(profile: dict, world: int) -> dict:
    """What one rank achieves with ``world`` ranks working at once (the nearest measured group)."""
    return _nearest(profile["per_rank"], world)[1]


def _rates(profile: dict, world: int, dtype: str, tokens: int, tp: int) -> tuple[float, float]:
    """Per-rank FLOP/s on model blocks with ``world`` ranks at work, and the best any measured group
    size reached (ranks alone on their share of the device), both for microbatches of ``tokens``
    under TP=``tp`` (:func:`shape_factor`)."""

    def flops(entry: dict) -> float:
        table = entry.get("block_flops") or entry["matmul_flops"]
        return table.get(dtype) or min(table.values())

    here = per_rank(profile, world)
    alone = max(flops(entry) for entry in profile["per_rank"].values())
    factor = shape_factor(here, dtype, tokens, tp)
    return flops(here) * factor, alone * factor


def shape_factor(entry: dict, dtype: str, tokens: int, tp: int) -> float:
    """A rank's block FLOP/s on microbatches of ``tokens`` under TP=``tp`` over the reference block's
    (the profile's ``block_shapes``): log-linear between the measured token counts, the nearest one
    outside them, at the largest measured TP degree not above ``tp``."""
    shapes = entry["block_shapes"]
    table = shapes.get(dtype) or next(iter(shapes.values()))
    _, by_tokens = _nearest(table, tp)
    points = sorted((math.log(int(n)), f) for n, f in by_tokens.items())
    return _interpolate(points, math.log(max(tokens, 1)))


def expert_factor(entry: dict, dtype: str, rows: int, tp: int, share: float) -> float:
    """The rate of a rank's expert matmuls over its blocks' (:func:`shape_factor`, ``entry`` a rank's figures): each
    of its experts multiplies ``share`` of a microbatch's ``rows`` (``top_k x ep / experts``), a small matmul's."""
    return shape_factor(entry, dtype, max(rows * share, 1.0), tp) / shape_factor(entry, dtype, rows, tp)


def optimizer_rate(profile: dict, world: int, optimizer: str, tensor_bytes: float) -> float:
    """Parameter bytes per second an ``optimizer`` step updates on tensors of ``tensor_bytes`` (:func:`_at_size`)."""
    return _at_size(per_rank(profile, world)["optimizer_bytes_per_s"][optimizer], tensor_bytes)


def _at_size(rates: dict[str, float], nbytes: float) -> float:
    """A rate per size in MiB at ``nbytes`` (:func:`~shardcore.cost.curves.at_size`)."""
    return at_size(rates, nbytes, unit=1 << 20)


def optimizer_seconds(profile: dict, world: int, optimizer: str, stage: StageFacts, shard: int = 1) -> float:
    """Seconds of one ``optimizer`` step over the parameters ``stage``'s rank holds (dense ones
    ``1 / shard`` each under FSDP), tensor by tensor at the rate for its size (:func:`optimizer_rate`):
    PyTorch's CPU optimizers update one tensor after another, so a few large tensors (embeddings)
    run at the large tensors' rate, however small the rest are. Facts without the sizes: their mean."""
    if optimizer == "none":
        return 0.0
    sizes = [b / shard for b in stage.dense_sizes] + list(stage.expert_sizes)
    if not sizes:
        held = stage.dense_bytes / shard
        mean = held / max(stage.dense_tensors, 1)
        return (held + stage.expert_bytes) / optimizer_rate(profile, world, optimizer, mean)
    return sum(b / optimizer_rate(profile, world, optimizer, b) for b in sizes)


def fresh_seconds(profile: dict, world: int, nbytes: float) -> float:
    """Seconds writing ``nbytes`` into a buffer just allocated (flat gradients, anew each step) at the profile's rate
    for that size (:func:`_at_size`; a CPU maps a large buffer's pages anew); without that rate: a copy's bandwidth."""
    here = per_rank(profile, world)
    if not here.get("fresh_bytes_per_s"):
        return 2 * nbytes / here["copy_bytes_per_s"]  # read and written
    return nbytes / _at_size(here["fresh_bytes_per_s"], nbytes)


def loss_seconds(profile: dict, world: int, elements: float, itemsize: int, calls: int = 1) -> float:
    """Seconds of the loss's forward and backward over ``elements`` logits in ``calls`` calls (a pipeline's
    microbatches; under TP with the logits gathered, every rank's whole vocabulary): the profile's measured
    cross-entropy rate on float32 logits of each call's size (:func:`~shardcore.cost.curves.at_size`: large logits
    leave a CPU's caches), and for a narrower dtype (``itemsize`` under 4 bytes) the upcast and the gradient's cast
    back, an elementwise pass each; a profile without that rate (calibrated before it): :data:`LOSS_PASSES` passes
    at the copy bandwidth."""
    here = per_rank(profile, world)
    rate, copy_rate = here.get("loss_elements_per_s"), here["copy_bytes_per_s"]
    if not rate:
        return LOSS_PASSES * elements * 4 / copy_rate
    if isinstance(rate, dict):  # by the logits' size (a profile of one size: a number)
        rate = at_size(rate, elements / max(calls, 1))
    casts = 2 * elements * (4 + itemsize) / copy_rate if itemsize < 4 else 0.0
    return elements / rate + casts


def predict(facts: dict, layout: dict, profile: dict, *, optimizer: str = "adamw") -> dict[str, Any]:
    """Predicted seconds per step and bytes per rank of ``layout`` (``dp, pp, sp, tp, ep``, ``mode``,
    ``data_parallel``, ``microbatches``) on the workload ``facts`` describes (see :func:`shardcore.cost.search`)."""
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"cost model: optimizer {optimizer!r} is not one of {sorted(OPTIMIZER_STATES)}")
    dp, pp, sp, tp = (layout[k] for k in ("dp", "pp", "sp", "tp"))
    m = layout["microbatches"]
    seq, batch = facts["seq"], facts["batch"]
    tokens = batch // dp * seq // sp  # this rank's tokens per step (all microbatches)
    rate, alone = _rates(profile, dp * pp * sp * tp, facts["dtype"], tokens // m, tp)
    here = per_rank(profile, dp * pp * sp * tp)
    whole = batch // dp * seq if sp > 1 else tokens  # after the last block the sequence is whole again
    heads, dim, causal = facts["attention"]
    attn_per_token = 4 * seq * heads * dim * (0.5 if causal else 1.0)
    attention_s, rest_s = attention_multipliers(here, facts["dtype"], dim, causal)  # per FLOP, over the block's
    shard = dp_shard(layout)
    stages = []  # per stage: its compute, its collectives, its optimizer step
    forward = [  # per stage: its forward FLOPs (the experts' too, before their rate)
        tokens * (2 * (s.matmul_weights - s.tail_weights) + s.attention_layers * attn_per_token)
        + whole * 2 * s.tail_weights
        for s in facts["stages"]
    ]
    for s, flops in zip(facts["stages"], forward, strict=True):
        fwd = flops - tokens * 2 * s.expert_weights
        experts = tokens * 2 * s.expert_weights / expert_factor(here, facts["dtype"], tokens // m, tp, s.expert_share)
        logits = whole * s.logits * facts.get("logits_gathered", 1)  # under TP, gathered: the whole vocabulary
        loss = loss_seconds(profile, dp * pp * sp * tp, logits, facts["itemsize"], m)
        optim = optimizer_seconds(profile, dp * pp * sp * tp, optimizer, s, shard)
        share = flops / max(sum(forward), 1.0)  # of the model's elementwise work: the stage's share of its FLOPs
        work = excess_seconds(
            here, facts.get("elementwise"), tokens=tokens // m, tp=tp, calls=m, share=share, flops=3 * flops
        )
        attention = tokens * s.attention_layers * attn_per_token
        flop_s = ((fwd - attention + experts) * rest_s + attention * attention_s) / rate
        stages.append((3 * flop_s + loss + work, communication(facts, layout, profile, s), optim))
    # within a stage's microbatches: its compute and the tp, sp and ep collectives inside its blocks;
    # once a step: the optimizer, the data-parallel sync and the boundaries' swaps
    inner = [c + sum(v for k, v in comm.items() if k in ("tp", "sp", "ep")) for c, comm, _ in stages]
    outer = [o + comm["dp"] + comm["pp"] for _, comm, o in stages]
    b = max(range(len(stages)), key=lambda i: inner[i] + outer[i])  # the slowest stage's figures
    compute, comm, optim = stages[b]
    own_s = inner[b] + outer[b]
    step = one_f_one_b(inner, outer, m, rate / alone) if pp > 1 else own_s
    return {
        "step_s": step,
        "compute_s": compute - max(own_s - step, 0.0),  # sped up where idle ranks lend their share
        "bubble_s": max(step - own_s, 0.0),
        "optimizer_s": optim,
        "communication_s": comm,
        "stages_s": inner,  # each stage's microbatches: compute and the collectives in its blocks
        "memory_bytes": memory_per_rank(facts, layout, optimizer),
    }


def communication(facts: dict, layout: dict, profile: dict, stage: StageFacts) -> dict[str, float]:
    """Seconds per step of each dim's collectives on ``stage``'s ranks (never overlapped)."""
    dp, pp, sp, tp, ep = (layout[k] for k in ("dp", "pp", "sp", "tp", "ep"))
    m, world = layout["microbatches"], dp * pp * sp * tp
    blocks = max(sum(s.blocks for s in facts["stages"]), 1)
    share = stage.blocks / blocks if pp > 1 else 1.0
    tokens = facts["batch"] // dp * facts["seq"] // sp
    out = {"tp": 0.0, "sp": 0.0, "dp": 0.0, "pp": 0.0, "ep": 0.0}
    tp_facts = facts.get("tp")
    if tp > 1 and tp_facts:
        for kind, (count, per_token, fixed) in tp_facts.items():
            nbytes = (per_token * tokens + fixed) * share
            out["tp"] += collective_seconds(profile, kind, tp, count * share * m, nbytes, world)
    sp_facts = facts.get("sp")
    if sp > 1 and sp_facts:  # each microbatch's layers exchange its share of the bytes; the gradients once a step
        layers = stage.blocks
        for kind, count, nbytes in sp_facts["per_layer"]:
            out["sp"] += collective_seconds(profile, kind, sp, count * layers * m, nbytes * layers, world)
        out["sp"] += collective_seconds(profile, "all_reduce", sp, stage.dense_tensors, stage.dense_bytes, world)
        hidden_bytes = tokens * facts["hidden"] * facts["itemsize"]
        out["sp"] += 2 * collective_seconds(profile, "all_gather", sp, m, hidden_bytes, world)
    out["dp"] = _data_parallel(profile, layout, stage)
    if pp > 1:
        boundary = tokens // m * facts["hidden"] * facts["itemsize"]
        out["pp"] = collective_seconds(profile, "send_recv", pp, 2 * m, 2 * m * boundary, world)
    if ep > 1 and facts.get("ep"):
        count, per_layer_bytes = facts["ep"]
        out["ep"] = collective_seconds(
            profile, "all_to_all", ep, count * stage.blocks * m, per_layer_bytes * stage.blocks, world
        )
    return out


def _data_parallel(profile: dict, layout: dict, stage: StageFacts) -> float:
    dp, ep = layout["dp"], layout["ep"]
    world = dp * layout["pp"] * layout["sp"] * layout["tp"]
    seconds = 0.0
    split = dp_shard(layout)
    if dp > 1 and split > 1:  # FSDP, ZeRO-2 (gathered once: kept to the backward), HSDP (then summed across)
        units = stage.blocks + 1
        gathers = 1 if layout["data_parallel"] == "zero2" else 2
        seconds += gathers * collective_seconds(profile, "all_gather", split, units, stage.dense_bytes / split, world)
        seconds += collective_seconds(profile, "reduce_scatter", split, units, stage.dense_bytes, world)
        if dp // split > 1:
            seconds += collective_seconds(profile, "all_reduce", dp // split, units, stage.dense_bytes / split, world)
        block = (stage.dense_bytes - stage.end_bytes) / max(stage.blocks, 1)  # each unit's gradients, flat, anew
        seconds += stage.blocks * fresh_seconds(profile, world, block) + fresh_seconds(profile, world, stage.end_bytes)
    elif dp > 1 and layout["pp"] > 1:  # DDP's stage under a pipeline: FSDP's replicate, the whole stage one unit
        seconds += collective_seconds(profile, "all_reduce", dp, 1, stage.dense_bytes, world)
        seconds += 2 * fresh_seconds(profile, world, stage.dense_bytes)  # its gradients flat, anew, and copied back
    elif dp > 1:
        buckets = max(1, math.ceil(stage.dense_bytes / DDP_BUCKET_BYTES))
        seconds += collective_seconds(profile, "all_reduce", dp, buckets, stage.dense_bytes, world)
    if stage.expert_bytes and dp // ep > 1:  # the copies of each expert summed
        seconds += collective_seconds(profile, "all_reduce", dp // ep, stage.blocks, stage.expert_bytes, world)
    return seconds
