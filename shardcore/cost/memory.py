"""Memory per rank in the cost model (:func:`memory_per_rank`): parameters, gradients (same bytes), optimizer state
(AdamW: two per parameter, SGD with momentum: one), activations (each tensor a block's backward reads, once per
token: :func:`~.sides.matmul_sides`; the tokens in flight: ``min(P - s, M)`` microbatches on stage ``s`` under
1F1B), the weights data parallelism holds gathered; the peak, the backward's (under FSDP without a pipeline, where
its walk holds the most: :func:`_sharded_walk`) or the optimizer step's (its temporaries beside the state)."""

from __future__ import annotations

from ..config import SHARDED_MODES
from .facts import backward_peak, gathered_bytes, loss_bytes_per_token, step_temporaries

OPTIMIZER_STATES = {"adamw": 2, "sgd": 1, "none": 0}
#: a block's backward computes the gradient of each tensor it kept (the norms' in float32) before it frees it:
#: measured on tracked pipeline stages without the loss (Llama-3-8B's and -70B's shapes, TP=2 and 4), half a
#: block's kept activations of the microbatch are live beside what the stage keeps at its peak (0.48-0.57)
BACKWARD_WORKING = 0.5
#: FSDP2's buffers through a backward, in unsharded blocks (the rank's tensor-parallel slice, :func:`_sharded_walk`):
#: the last all-gather's output, kept until the next (at the backward's start too); in a block's backward its
#: gradients before their reduce-scatter and, from the second block on, the reduce-scatter input before it, kept
#: until this one's. Measured on tracked 70B ranks (HSDP 2 x 2 x TP=2, FSDP 2 x TP=4): 1, 2 and 3 blocks.
SHARDED_BUFFERS = (1, 2, 3)


def dp_shard(layout: dict) -> int:
    """The ranks each dense parameter is split over by data parallelism: ``dp`` under FSDP and ZeRO-2,
    HSDP's shard group (``layout["shard"]``), 1 under DDP or none."""
    mode, dp = layout["data_parallel"], layout["dp"]
    if mode == "hsdp":
        return layout.get("shard", dp)
    return dp if mode in SHARDED_MODES else 1


def _overlap(stage, acts: int, one: float, grads: int, layout: dict, in_flight: int, itemsize: int) -> tuple[int, int]:
    """What the peak leaves out of the gradients ``grads`` and of the activations ``acts`` (``one``: a microbatch's,
    kept). Without a pipeline: gradients or activations, not both (``zero_grad(set_to_none=True)``: a forward holds
    no gradient). A pipeline stage whose microbatches outnumber its warm-up (1F1B: ``min(P - s, M)`` forwards first)
    runs a forward beside the gradients of the backward before it: neither. Otherwise it peaks where its first
    backward holds the most (:func:`~.facts.backward_peak`: some gradients allocated, some of the microbatch's
    activations freed; measured on tracked first stages: at the warm-up's end for a MoE's, whose experts' gradients
    come first, at the backward's end for a dense model's, whose embeddings' come last)."""
    if layout["pp"] == 1:
        return min(acts, grads), 0
    if layout["microbatches"] > in_flight:
        return 0, 0
    held, freed = backward_peak(stage, one, itemsize, dp_shard(layout))
    return int(grads - held), int(freed)


def _sharded_walk(stage, layout: dict, acts: int, one: float, kept: float) -> tuple[int, int, int]:
    """``(gathered, gradients held, activations and buffers)`` where a backward under FSDP or HSDP without a pipeline
    holds the most. At its start: the root unit gathered (the blocks resharded after their forward), every
    activation. In the ``k``-th block from the end: the root and that block gathered (the largest block's bytes),
    the head's gradients unsharded (the root's reduce-scatter runs last), ``k - 1`` blocks' reduce-scattered, the
    activations ``one`` keeps in the blocks not yet walked (the head's and the loss's freed) and ``kept``, the logits
    the step's output holds. At its end: every gradient, the root's unsharded. FSDP's buffers beside each
    (:data:`SHARDED_BUFFERS`). Measured on tracked ranks: long sequences peak at the start, short ones inside (the
    70B's HSDP x TP at 4096 tokens in the second block from the end)."""
    blocks, shard, root, block = max(stage.blocks, 1), dp_shard(layout), stage.end_bytes, stage.largest_block
    head = stage.walk[len(stage.walk) - stage.tail_walk :]  # the head's and final norm's entries, the walk's last
    in_blocks = one * (1 - sum(act for _, _, act, _ in head) / max(stage.activation_elements, 1))
    points = [(root, 0.0, acts + SHARDED_BUFFERS[0] * block)]
    for k in range(1, blocks + 1):
        held = stage.tail_bytes + (k - 1) * block / shard + stage.expert_bytes * k / blocks
        left = in_blocks * (1 - (k - 1) / blocks)
        points.append((root + block, held, left + kept + SHARDED_BUFFERS[min(k, 2)] * block))
    sharded = (stage.dense_bytes - root) / shard + stage.expert_bytes
    points.append((root, sharded + root, kept + SHARDED_BUFFERS[1] * block))
    return tuple(int(x) for x in max(points, key=sum))


def memory_per_rank(facts: dict, layout: dict, optimizer: str = "adamw", index: int | None = None) -> dict[str, int]:
    """Bytes the largest stage's rank (or stage ``index``'s) holds: parameters, gradients, optimizer state, activations
    (at the peak), the weights data parallelism holds gathered (:func:`~.facts.gathered_bytes`); the peak: the
    backward's, what it holds of the gradients and activations as :func:`_overlap` says, or the optimizer step's
    (:func:`~.facts.step_temporaries`)."""
    dp, pp, sp, m = layout["dp"], layout["pp"], layout["sp"], layout["microbatches"]
    tokens_mb = facts["batch"] // dp // m * facts["seq"] // sp
    worst = {}
    for s, stage in enumerate(facts["stages"]):
        params = int(stage.dense_bytes / dp_shard(layout) + stage.expert_bytes)
        in_flight = min(pp - s, m) if pp > 1 else 1
        # torch's stage holds a receive buffer a microbatch, from its setup on, for its input (all but the first)
        # and its output's gradient (all but the last)
        buffers = ((s > 0) + (s < pp - 1)) * m * facts["hidden"] * facts["itemsize"] if pp > 1 else 0
        loss = loss_bytes_per_token(facts, stage, sp, pipelined=pp > 1)  # the head's stage only: logits 0 elsewhere
        split = layout["tp"] if layout.get("mode") == "split_gather" else 1  # Megatron's: the region's edges split
        kept = stage.activation_elements - stage.wide_elements * (1 - 1 / split)
        one = tokens_mb * (kept * facts["itemsize"] + 4 * stage.norm_elements / split)  # a microbatch's, kept
        acts = int(in_flight * one + tokens_mb * (loss + sp * buffers))  # stages hand on the whole sequence
        if pp > 1 and not stage.logits:  # a stage without the loss peaks in a block's backward
            acts += int(BACKWARD_WORKING * one / max(stage.blocks, 1))
        if pp == 1 and layout["data_parallel"] in ("fsdp", "hsdp") and dp_shard(layout) > 1:
            ranks = facts.get("logits_gathered", 1)  # the gathered logits the step's output holds to its end
            kept = tokens_mb * sp * stage.logits * ranks * facts["itemsize"] if ranks > 1 else 0
            gathered, held, acts = _sharded_walk(stage, layout, acts, one, kept)
        else:
            left_out, freed = _overlap(stage, acts, one, params, layout, in_flight, facts["itemsize"])
            gathered, held = int(gathered_bytes(stage, layout["data_parallel"], dp)), params - left_out
            acts -= freed
        row = {"parameters": params, "gathered": gathered, "gradients": params}
        row |= {"optimizer": OPTIMIZER_STATES[optimizer] * params, "activations": acts}
        step = 2 * params + row["optimizer"] + step_temporaries(stage, optimizer, dp_shard(layout))  # FSDP: resharded
        row["total"] = max(sum(row.values()) - params + held, step)  # the step's own peak
        if s == index:
            return row
        if not worst or row["total"] > worst["total"]:
            worst = row
    return worst
