"""Random streams for tensor-parallel regions (Megatron-LM's RNG tracker, for CPU and CUDA).

Dropout must draw *different* numbers on different ranks where activations are split (each rank
drops its own attention heads, like the unsharded model drops every head independently) and
the *same* numbers where activations are replicated (residual-stream dropout), or the replicas
drift apart. Every rank starts from the same seed, so the default stream is already in step;
:func:`fork_tp_rng` switches to a second stream, seeded ``initial_seed + 2718 + tp_rank``, for the
code that runs on split activations, and back afterwards, leaving the default stream untouched.
Code on replicated activations *inside* such a block (a residual dropout at the end of an
attention module) goes back to the default stream with :func:`run_in_shared_rng`.

A block recomputed by activation checkpointing must draw what its forward drew: PyTorch's
checkpoint replays the default stream, :data:`STREAMS` (carried into the recompute by
:func:`shardcore.tensor_parallel.recompute.carry_into_recompute`) replays the per-rank ones. A
recompute that draws on a per-rank stream nobody replayed raises :data:`RECOMPUTE_DRAWS`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import nn

from ..distributed.collectives import group_key, group_rank

__all__ = ["STREAMS", "fork_tp_rng", "in_tp_rng", "reset_streams", "run_in_shared_rng", "run_in_tp_rng"]

#: each per-rank stream's state, by ``(group key, device, torch.initial_seed())``: a new seed starts a new stream
_STATES: dict[tuple, torch.Tensor] = {}
#: the default stream's state saved by each open fork_tp_rng block, innermost last, per device
_OUTER: dict[str, list[torch.Tensor]] = {"cpu": [], "cuda": []}
#: what runs now, innermost last, per device: a per-rank stream's key, or None for the shared one inside it.
#: A fork for the stream already running is a no-op: re-entering would replay that stream's numbers.
_RUNNING: dict[str, list] = {"cpu": [], "cuda": []}
#: open replays of a forward's per-rank streams (:class:`_Streams`): their recompute draws what the forward drew
_REPLAYING: list[bool] = []
SEED_OFFSET = 2718
RECOMPUTE_DRAWS = (
    "shardcore: a block recomputed by gradient (activation) checkpointing drew random numbers on its "
    "per-rank stream (dropout on this rank's attention heads): the recomputation would use other dropout "
    "masks than the forward did and the gradients would be wrong, so shardcore stops here, on every rank "
    "alike. Checkpoint through the model's own gradient_checkpointing_enable() (HuggingFace models: "
    "shardcore replays the per-rank streams of those recomputes), turn this checkpointing off, or set "
    "the attention dropout to 0 while it is on."
)


def _get(device: str) -> torch.Tensor:
    return torch.cuda.get_rng_state() if device == "cuda" else torch.get_rng_state()


def _set(device: str, state: torch.Tensor) -> None:
    if device == "cuda":
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


def _base_seed(device: str) -> int:
    """The seed of the default stream: inside a fork, the one recorded when the outermost began
    (a per-rank stream's state carries its own seed, which ``torch.initial_seed()`` then reports)."""
    seed = next((key[2] for key in _RUNNING[device] if key is not None), None)
    return torch.initial_seed() if seed is None else seed


@contextlib.contextmanager
def fork_tp_rng(group, device: str = "cpu") -> Iterator[None]:
    """Run the block on this rank's tensor-parallel random stream (one stream per group's ranks,
    device and ``torch.manual_seed``: re-seeding starts it again, as it does the default stream)."""
    key = (group_key(group), device, _base_seed(device))
    if _RUNNING[device] and _RUNNING[device][-1] == key:  # on this stream already (a block inside a block)
        yield
        return
    if key not in _STATES:
        seed = key[2] + SEED_OFFSET + group_rank(group)
        gen = torch.Generator(device=device).manual_seed(seed)
        _STATES[key] = gen.get_state()
    _OUTER[device].append(_get(device))
    _RUNNING[device].append(key)
    _set(device, _STATES[key])
    recomputing = torch._C._current_graph_task_id() != -1  # forward code inside a backward: a checkpoint's recompute
    try:
        yield
    finally:
        _RUNNING[device].pop()
        drew = recomputing and not _REPLAYING and not torch.equal(_get(device), _STATES[key])
        _STATES[key] = _get(device)
        _set(device, _OUTER[device].pop())
    if drew:
        raise RuntimeError(RECOMPUTE_DRAWS)


class _Streams:
    """The per-rank streams as a checkpointed block's forward found them, replayed in its
    recompute (a :class:`~shardcore.tensor_parallel.recompute.Carried`): the recompute draws the
    forward's numbers, and the live streams go on from where the forward left them."""

    def capture(self) -> dict:
        return dict(_STATES)  # the states are never changed in place: a shallow copy keeps them

    @contextlib.contextmanager
    def restore(self, token: dict) -> Iterator[None]:
        live = dict(_STATES)
        _STATES.clear()
        _STATES.update(token)
        _REPLAYING.append(True)
        try:
            yield
        finally:
            _REPLAYING.pop()
            _STATES.clear()
            _STATES.update(live)


#: every model's per-rank streams (they are per process): what a recompute must replay
STREAMS = _Streams()


def reset_streams() -> None:
    """Forget every per-rank stream: the next draw of each starts again from ``torch.initial_seed()``, as
    in a fresh process (two runs compared draw the same numbers)."""
    _STATES.clear()


def in_tp_rng(device: str = "cpu") -> bool:
    """Whether code runs inside a :func:`fork_tp_rng` block (on a per-rank stream) now."""
    return bool(_OUTER[device])


@contextlib.contextmanager
def _shared_stream(device: str) -> Iterator[None]:
    """Inside a :func:`fork_tp_rng` block, run on the default (shared) stream; elsewhere a no-op."""
    if not _OUTER[device]:
        yield
        return
    inner = _get(device)
    _set(device, _OUTER[device][-1])
    _RUNNING[device].append(None)
    try:
        yield
    finally:
        _RUNNING[device].pop()
        _OUTER[device][-1] = _get(device)
        _set(device, inner)


def _wrap(module: nn.Module, stream) -> None:
    forward = module.forward

    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        if not module.training:
            return forward(*args, **kwargs)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)] or list(module.parameters())
        device = "cuda" if tensors and tensors[0].is_cuda else "cpu"
        with stream(device):
            return forward(*args, **kwargs)

    wrapped.shardcore_stream = True  # ``wrapped.__wrapped__`` is the forward beneath the stream switch
    module.forward = wrapped


def run_in_tp_rng(module: nn.Module, group) -> None:
    """Make ``module``'s forward (in training mode) draw from the per-rank stream."""
    _wrap(module, lambda device: fork_tp_rng(group, device))


def run_in_shared_rng(module: nn.Module) -> None:
    """Make ``module``'s forward (in training mode) draw from the shared stream even when it runs
    inside a :func:`run_in_tp_rng` module (e.g. the residual dropout inside an attention module)."""
    _wrap(module, _shared_stream)
