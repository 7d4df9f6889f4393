"""A policy's :class:`~shardcore.spec.SequenceSpec` read with its defaults filled in."""

from __future__ import annotations

from ..spec.attention import attention_registry


def regions(policy) -> list:
    """The runs of blocks the sequence split covers (each split at its first block, gathered after
    its last): the spec's, or one run of every block."""
    found = policy.sequence().regions
    return [list(r) for r in found] if found is not None else [policy.blocks()]


def heads_of(policy) -> tuple[int, int]:
    """``(attention heads, key/value heads)`` the spec declares; ``NotImplementedError`` when it does not."""
    heads = policy.sequence().heads
    if heads is None:
        raise NotImplementedError(f"{type(policy).__name__} declares no SequenceSpec.heads")
    return tuple(heads)


def attention_problem(policy, mode: str) -> str | None:
    """Why the model's attention cannot run under ``mode`` (``None``: it can), before any collective."""
    ask = policy.sequence().attention_problem
    if ask is not None:
        return ask(mode)
    try:
        return attention_registry().sequence_problem(policy.model, mode, routed=policy.sequence().routed)
    except NotImplementedError as err:
        return f"sequence_parallelism_mode={mode!r}: {err}"


def set_attention(policy, state) -> str:
    """Make the model's attention run under ``state.mode``; the name now in use."""
    spec = policy.sequence()
    if spec.set_attention is not None:
        return spec.set_attention(state)
    return attention_registry().use_sequence(policy.model, state.mode, routed=spec.routed)
