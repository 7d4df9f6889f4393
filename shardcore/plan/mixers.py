"""The token mixers outside the attention that a zero-config model's blocks hold: what Ulysses and
the ring run over the whole sequence (:mod:`shardcore.sequence.gathered`).

A hybrid model's blocks mix tokens in two ways: transformers' attention (through the registry the
sequence split switches) and its own arithmetic over the sequence, a linear attention (Qwen3-Next's
and OLMo-hybrid's Gated DeltaNet, MiniMax's lightning attention), a state-space mixer (Falcon-H1's,
Nemotron-H's Mamba-2) or a short convolution (LFM's, Inkling's). Found from the modules alone:

* a convolution anywhere in a block;
* in a block whose layer type (the config's ``layer_types``) is recurrent, a module whose class name
  ends as a mixer's does (``...Attention``, ``...DeltaNet``, ``...Mixer``, ...) and that does not call
  the registry;

each run over the whole sequence as the largest module around it that holds no registry attention
(Inkling's key convolution inside its attention: the convolution's own wrapper, not the attention).
A block whose layer type is recurrent and where none is found, or a convolution with no module
around it but the attention, is refused by name.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import nn

from ..integrations.hf.attention import reads_registry

__all__ = ["Mixers", "recurrent_kind", "token_mixers"]

#: how the class names of mixers outside the attention end
_MIXER_ENDS = ("Attention", "DeltaNet", "Mixer", "Mamba", "Conv", "Convolution", "Recurrence", "RWKV", "SSM")


def recurrent_kind(kind: str) -> bool:
    """A config's layer type that is no attention of the registry (linear attention, a state-space or
    recurrent mixer, a convolution)."""
    return any(word in kind for word in ("linear", "mamba", "conv", "recurrent", "delta", "rwkv", "ssm"))


def _convolves(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.conv._ConvNd)


def _around(seed: str, block: str, modules: dict, registry: set) -> str | None:
    """The largest module of ``block`` around ``seed`` (itself included) that holds no registry attention;
    ``None`` when that is a bare convolution (its input is ``(batch, channels, sequence)``)."""
    best, name = None, seed
    while name != block:
        if any(r == name or r.startswith(f"{name}.") for r in registry):
            break
        best, name = name, name.rpartition(".")[0]
    return None if best is None or _convolves(modules[best]) else best


class Mixers(NamedTuple):
    """What :func:`token_mixers` found."""

    gathered: list[str]  # to run over the whole sequence
    unmixed: list[str]  # blocks whose layer type is a feed-forward's, with no token mixer at all
    why: str | None  # why the blocks cannot run with the sequence split (None: every mixer found)


def _feed_forward(kind: str) -> bool:
    return kind in ("mlp", "moe", "ffn", "feed_forward", "dense")


def token_mixers(config, blocks: list[tuple[str, nn.Module]]) -> Mixers:
    """The mixers outside the attention ``blocks`` hold, the blocks that mix no tokens, or why they
    cannot run with the sequence split."""
    kinds = [str(k) for k in (getattr(config, "layer_types", None) or [])]
    found: list[str] = []
    unmixed: list[str] = []
    for i, (b, block) in enumerate(blocks):
        kind = kinds[i] if i < len(kinds) else ""
        recurrent = recurrent_kind(kind)
        modules = dict(block.named_modules(prefix=b))
        registry = {n for n, m in modules.items() if reads_registry(type(m))}
        seeds = [
            n
            for n, m in modules.items()
            if n != b
            and (_convolves(m) or (recurrent and n not in registry and type(m).__name__.endswith(_MIXER_ENDS)))
        ]
        if recurrent and not seeds:
            return Mixers(
                [],
                [],
                (
                    f"{type(config).__name__} has {kind!r} layers, which mix tokens outside transformers' attention, "
                    f"and {b} holds no module shardcore recognizes as that mixer"
                ),
            )
        for seed in seeds:
            top = _around(seed, b, modules, registry)
            if top is None:
                return Mixers(
                    [],
                    [],
                    (
                        f"{seed} ({type(modules[seed]).__name__}) mixes tokens outside the attention, over a rank's part "
                        "of them, with no module around it to run over the whole sequence"
                    ),
                )
            found.append(top)
        if _feed_forward(kind) and not registry and not seeds:
            unmixed.append(b)
    found = list(dict.fromkeys(found))
    return Mixers([n for n in found if not any(n.startswith(f"{o}.") for o in found)], unmixed, None)
