"""Where a collective belongs: the sharded model whose forward (or backward) issues it.

Each sharded model has a :class:`Scope`: the bound its collectives wait at most (its
``ShardConfig(collective_timeout=...)``), how many of each kind it issued, and the parallel module
its forward entered last (named when a collective times out). Collectives outside any model's
forward (clipping, saving) run in :data:`DEFAULT_SCOPE`. :data:`COUNTS` counts every collective of
the process (:func:`count_collectives`), :data:`BYTES` the bytes this rank put into each kind
(:func:`count_collective_bytes`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections import Counter
from collections.abc import Iterator

import attrs
import torch

from ..attach import attached
from . import audit

COUNTS: Counter[str] = Counter()
#: Bytes this process put into its collectives, by kind: what this rank contributes (the tensor an
#: all-reduce sums, its part of an all-gather, the whole input of a reduce-scatter, what it sends).
BYTES: Counter[str] = Counter()


@contextlib.contextmanager
def count_collectives() -> Iterator[Counter[str]]:
    """Count the collectives issued inside the ``with`` block: ``{"all_reduce": n, ...}``."""
    with _delta(COUNTS) as delta:
        yield delta


@contextlib.contextmanager
def count_collective_bytes() -> Iterator[Counter[str]]:
    """The bytes this rank put into the collectives inside the ``with`` block, by kind (:data:`BYTES`)."""
    with _delta(BYTES) as delta:
        yield delta


@contextlib.contextmanager
def _delta(counter: Counter[str]) -> Iterator[Counter[str]]:
    before = counter.copy()
    delta: Counter[str] = Counter()
    try:
        yield delta
    finally:
        delta.update(counter)
        delta.subtract(before)
        for key in [k for k, n in delta.items() if n == 0]:
            del delta[key]


#: Default bound, in seconds, on how long one of shardcore's collectives waits for the other ranks.
DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_ENV = "SHARDCORE_COLLECTIVE_TIMEOUT"


class CollectiveTimeout(RuntimeError):
    """A shardcore collective waited longer than the bound for the other ranks of its group."""


class CollectivePeerLost(CollectiveTimeout):
    """A shardcore collective lost a peer while waiting (it exited, or its side of the transport
    closed): the same mistakes as a time-out, seen from the rank that stayed."""


@attrs.define(eq=False)
class Scope:
    """One sharded model's collectives: their bound, their counts, the parallel module its forward
    last entered (named in a time-out), a running sequence number. :func:`shardcore.optimize`
    gives each model its own, entered for each of its forwards; the backward's collectives carry
    the scope of the forward that recorded them (:func:`backward_of`). Collectives outside any
    model's forward (clipping, saving) run in the process's default scope."""

    name: str = "shardcore"
    timeout_s: float | None = None  # None: wait as long as the process group does
    counts: Counter[str] = attrs.field(factory=Counter)
    module: str = "a shardcore collective outside any parallel module"
    seq: int = 0


#: the scope of collectives outside any sharded model's forward (see :func:`set_collective_timeout`)
DEFAULT_SCOPE = Scope()
_CURRENT: contextvars.ContextVar[Scope] = contextvars.ContextVar("shardcore_scope", default=DEFAULT_SCOPE)


def current_scope() -> Scope:
    """The scope of the sharded model whose forward runs now, else :data:`DEFAULT_SCOPE`."""
    return _CURRENT.get()


def enter_scope_per_forward(model: torch.nn.Module, scope: Scope) -> None:
    """Run each forward of ``model`` in ``scope`` (hooks first and last; a forward that raised too)."""
    tokens: list = []

    def enter(module, args):
        tokens.append(_CURRENT.set(scope))

    def leave(module, args, output):
        if tokens:
            _CURRENT.reset(tokens.pop())

    attached(model).before_forward(model, "scope", enter, what="the model's bounded, named collectives")
    attached(model).after_forward(model, "scope", leave, always=True)


class Where(str):
    """A collective's description that also carries the :class:`Scope` it belongs to."""

    scope: Scope


def _tagged(text: str, scope: Scope) -> Where:
    where = Where(text)
    where.scope = scope
    return where


def backward_of(suffix: str = "") -> Where:
    """``"backward of <module>"`` for an autograd function's backward collectives, recorded now (in
    forward): they then count and wait in this forward's scope."""
    scope = current_scope()
    return _tagged(f"backward of {scope.module}{suffix}", scope)


def _scope(where) -> Scope:
    return getattr(where, "scope", None) or current_scope()


def _count(kind: str, where, tensor: torch.Tensor | None = None) -> None:
    scope = _scope(where)
    COUNTS[kind] += 1
    if tensor is not None:
        audit.check_device(kind, where, tensor)
        BYTES[kind] += tensor.numel() * tensor.element_size()
    if scope is not DEFAULT_SCOPE:
        scope.counts[kind] += 1
    scope.seq += 1


def resolve_timeout(seconds: float | None = None) -> float:
    """``seconds``, else ``$SHARDCORE_COLLECTIVE_TIMEOUT``, else :data:`DEFAULT_TIMEOUT_S`."""
    if seconds is not None:
        return float(seconds)
    value = os.environ.get(TIMEOUT_ENV)
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} must be a positive number of seconds")
    return seconds


def set_collective_timeout(seconds: float | None) -> None:
    """Bound the collectives outside any sharded model's forward (clipping, saving; a model's own
    bound is its ``ShardConfig(collective_timeout=...)``); ``None``: wait as long as the group does."""
    DEFAULT_SCOPE.timeout_s = seconds
