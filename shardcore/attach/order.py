"""The run order of the hooks around a model's forward (:mod:`shardcore.attach`): the core's own, declared
here, and a plugin's, placed by the ``before=`` / ``after=`` it declares."""

from __future__ import annotations

import itertools

__all__ = ["AFTER_FORWARD", "BEFORE_FORWARD", "BRACKET", "CORE", "attached_too", "order", "places"]

#: The core's hooks before the model's forward, in the order they run (each a name an :class:`Entry` takes).
BEFORE_FORWARD = (
    "scope",  # every collective below, the other hooks' too, is this model's (bounded, named)
    "new_adapters",  # LoRA adapters added since optimize: cut over the group before anything reads them
    "grad_mark",  # parameters added since: their gradients marked (before FSDP swaps the root's parameters)
    "inference_only",  # an inference-only model put back in training: refused before any collective
    "same_inputs",  # every rank of the group sees the same batch (a collective of digests)
    "same_sequence_batch",  # ... and every rank of the sequence-parallel group
    "watch_sequence",  # what the sequence split cannot honour, refused; activation checkpointing noted
    "share_copies",  # column layers reading one tensor share one copy (plans)
    "checkpointing",  # the model's gradient checkpointing recomputes with the forward's random streams
    "meta_guard",  # weights still on the meta device: refused with the fix
    "idle_runs",  # inputs this rank's batch lacks whose modules the other data-parallel ranks run: noted
)
#: The core's hooks after the model's forward, in the order they run; ``always`` ones run after a forward that
#: raised too.
AFTER_FORWARD = (
    "share_copies",  # the forward's shared copies closed (always)
    "overflow_agreement",  # fp16: the ranks agree on an overflow in the backward
    "scope",  # the model's scope left (always): last
)
#: the hook that brackets every other: first before the forward, last after it
BRACKET = "scope"


CORE = {"before": BEFORE_FORWARD, "after": AFTER_FORWARD}


def places(before, after) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(before, after)`` as tuples of hook names (each may be given as one name)."""
    return tuple([before] if isinstance(before, str) else before), tuple([after] if isinstance(after, str) else after)


def attached_too(names: set[str]) -> str:
    """The plugins' hooks attached already, for a message."""
    return f"; attached here: {', '.join(sorted(names))}" if names else ""


def order(kind: str, entries: dict) -> list[str]:
    """The run order of the core's hooks of ``kind`` and ``entries``' (``{name: its Entry}``, each with the
    ``before`` / ``after`` it declares; see :meth:`Attached.in_order`); a
    :class:`ValueError` naming the hooks whose declared places contradict each other."""
    core = CORE[kind]
    nodes = list(dict.fromkeys([*core, *sorted(entries)]))
    edges: dict[str, set[str]] = {n: set() for n in nodes}  # {hook: the hooks that run after it}
    for first, then in itertools.pairwise(core):
        edges[first].add(then)
    for name, entry in entries.items():
        edges[name] |= {n for n in entry.before if n in edges}
        for n in (n for n in entry.after if n in edges):
            edges[n].add(name)
        if name != BRACKET:  # scope first before the forward, last after it
            (edges[BRACKET].add(name) if kind == "before" else edges[name].add(BRACKET))
    waiting = {n: 0 for n in nodes}
    for then in (t for ts in edges.values() for t in ts):
        waiting[then] += 1
    out: list[str] = []
    ready = [n for n in nodes if not waiting[n]]
    while ready:  # a plugin's hook first when it may run (as early as its place allows), then the core's
        name = min(ready, key=lambda n: (n in core, core.index(n) if n in core else 0, n))
        ready.remove(name)
        out.append(name)
        for then in sorted(edges[name]):
            waiting[then] -= 1
            if not waiting[then]:
                ready.append(then)
    if len(out) < len(nodes):
        stuck = {n for n in nodes if n not in out}  # the circles and what follows them
        while sinks := {n for n in stuck if not edges[n] & stuck}:  # what only follows them
            stuck -= sinks
        stuck = sorted(stuck)
        raise ValueError(
            f"the {kind}-forward hooks {', '.join(stuck)} declare places that contradict each other or shardcore's "
            f"order ({' -> '.join(core)}; {BRACKET} {'first' if kind == 'before' else 'last'}): fix their "
            "before= / after="
        )
    return out
