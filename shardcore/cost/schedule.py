"""A pipeline's step where its ranks may share their devices (a CPU's cores): 1F1B run microbatch by microbatch.

Each stage's rank runs its microbatches' forwards and backwards in 1F1B order (``min(P - s - 1, M)`` forwards
first, then one backward after each forward, then the remaining backwards), each when its input is there: a
forward after the previous stage's forward of that microbatch, a backward after the next stage's backward of it;
then the rank's once-a-step work (its optimizer step, its data-parallel sync). At every moment the ranks with work
they can do share the devices equally, each at most at its own device's speed: ``devices = shared x ranks``, where
``shared`` is a rank's speed with every rank at work over its speed alone (1 where each rank owns its device). A
stage's other ranks (data-, sequence- and tensor-parallel) run the same work at the same time: with ``r`` ranks a
stage, ``n`` stages with work run at ``min(1, shared x P x r / (n x r))``, the same as one rank a stage."""

from __future__ import annotations

import heapq

#: a microbatch's backward over its forward: twice the FLOPs
BACKWARD = 2.0


def one_f_one_b(inner: list[float], outer: list[float], m: int, shared: float) -> float:
    """Seconds of a 1F1B step over stages whose ``m`` microbatches take ``inner`` in all and whose once-a-step work
    takes ``outer``, both at the shared speed (every rank at work); the step ends when the last rank is done."""
    p = len(inner)
    devices = shared * p  # a stage's ranks in step: as many devices a stage as it has ranks, times shared
    work = [[] for _ in range(p)]  # per stage: (kind, microbatch, seconds alone) in its order
    for s in range(p):
        slot = inner[s] * shared / m
        forward = slot / (1 + BACKWARD)
        warm = min(p - s - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(warm, m):
            order += [("F", i), ("B", i - warm)]
        order += [("B", i) for i in range(m - warm, m)]
        work[s] = [(kind, i, forward * (BACKWARD if kind == "B" else 1.0)) for kind, i in order]
        work[s].append(("O", 0, outer[s] * shared))
    done = [{"F": -1, "B": -1} for _ in range(p)]  # the last microbatch each stage finished, forward and backward
    at = [0] * p  # each stage's next task
    # the ranks with work all run at one speed, so the seconds alone each has run since any moment are the same for
    # all: one clock (``progress``); a task ends when it reaches the task's start plus its seconds alone
    running: list[tuple[float, int]] = [(work[0][0][2], 0)]  # (where it ends, its stage): the first forward
    busy, clock, progress = {0}, 0.0, 0.0
    while running:
        speed = min(1.0, devices / len(running))
        ends, s = heapq.heappop(running)
        clock += (ends - progress) / speed
        progress = ends
        busy.discard(s)
        kind, i, _ = work[s][at[s]]
        if kind != "O":
            done[s][kind] = i
        at[s] += 1
        for t in (s - 1, s, s + 1):  # whose next task this one may have made ready
            if 0 <= t < p and t not in busy and at[t] < len(work[t]) and _ready(work[t][at[t]], t, p, done):
                heapq.heappush(running, (progress + work[t][at[t]][2], t))
                busy.add(t)
    return clock


def _ready(task: tuple, s: int, p: int, done: list[dict]) -> bool:
    kind, i, _ = task
    if kind == "F":
        return s == 0 or done[s - 1]["F"] >= i
    if kind == "B":
        return done[s]["F"] >= i and (s == p - 1 or done[s + 1]["B"] >= i)
    return True
