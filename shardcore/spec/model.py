"""What the kernels, the checkpoints and the checks read from a family."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from .under import inside, under

__all__ = ["CheckpointSpec", "ChecksSpec", "KernelSpec"]


@attrs.frozen(kw_only=True)
class KernelSpec:
    """What the kernel switches act on.

    * ``norm_classes``: the model library's normalization classes ``enable_fused_normalization`` puts on
      fused kernels (subclasses of ``nn.LayerNorm`` computing a plain layer norm; RMSNorms computing
      ``weight * x / rms(x)`` in fp32). ``nn.LayerNorm`` and ``nn.RMSNorm`` are always covered.
    * ``fusible``: ``(name, module)`` of the submodules ``enable_jit_fused`` compiles (projections and
      elementwise work: bias + GeLU, SwiGLU, bias + dropout + residual; not attention).
    * ``attention_backend``: ``f(backend) -> name now running`` for ``enable_flash_attention``
      (``"flash_attention_2"`` or ``"sdpa"``). ``None``: HuggingFace's attention registry.

    Composite: the parts' classes and modules (under their paths); the backend is the composite's own.
    """

    norm_classes: tuple[type, ...] = attrs.field(default=(), converter=tuple)
    fusible: Sequence[tuple[str, object]] = attrs.field(default=(), converter=tuple)
    attention_backend: Callable[[str], str] | None = None

    @classmethod
    def merge(cls, own: KernelSpec | None, parts: Mapping[str, KernelSpec]) -> KernelSpec:
        own = own or cls()
        return cls(
            norm_classes=tuple(dict.fromkeys(c for p in [own, *parts.values()] for c in p.norm_classes)),
            fusible=(*own.fusible, *((under(path, n), m) for path, p in parts.items() for n, m in p.fusible)),
            attention_backend=own.attention_backend,
        )


def _parted(own, parts: Mapping[str, Callable | None], rename: Callable) -> Callable | None:
    """One ``f(names) -> {model name: value}`` asking the composite's own ``f`` and each part's, each with
    the names inside it (relative), its answers named back from the whole model by ``rename(path, value)``."""
    askers = [(path, f) for path, f in parts.items() if f is not None]
    if own is None and not askers:
        return None

    def ask(names: list[str]) -> dict:
        out = dict(own(names)) if own is not None else {}
        for path, f in askers:
            mine = [n for n in (inside(path, name) for name in names) if n is not None]
            out.update({under(path, k): rename(path, v) for k, v in f(mine).items()})
        return out

    return ask


@attrs.frozen(kw_only=True)
class CheckpointSpec:
    """What the checkpoint readers and writers need.

    * ``names``: ``f(model tensor names) -> {model name: checkpoint name}`` for names the library's format
      spells otherwise; :func:`shardcore.load_checkpoint` accepts either, ``save_checkpoint`` writes the
      checkpoint's. ``None``: none differ.
    * ``parts``: ``f(names) -> {model name: StackedParts}`` for tensors the format keeps in pieces
      (:class:`shardcore.checkpoint.parts.StackedParts`); each rank reads only its slice's pieces.
    * ``materialize``: ``f(modules)`` fills the buffers a checkpoint does not hold (rotary frequencies)
      after a meta-built model was materialized. ``None``: the HuggingFace convention,
      ``model._init_weights(module)``.

    Composite: the parts' names and pieces under their paths; ``materialize`` is the composite's own.
    """

    names: Callable[[list[str]], dict[str, str]] | None = None
    parts: Callable[[list[str]], dict] | None = None
    materialize: Callable[[list], None] | None = None

    @classmethod
    def merge(cls, own: CheckpointSpec | None, parts: Mapping[str, CheckpointSpec]) -> CheckpointSpec:
        own = own or cls()
        return cls(
            names=_parted(own.names, {p: s.names for p, s in parts.items()}, under),
            parts=_parted(
                own.parts,
                {p: s.parts for p, s in parts.items()},
                lambda path, stacked: stacked.renamed(lambda key: under(path, key)),
            ),
            materialize=own.materialize,
        )


@attrs.frozen(kw_only=True)
class ChecksSpec:
    """What ``ShardConfig(verify=...)`` checks: ``blocks``, the ``(name, module)`` blocks compared before
    and after sharding (``None``: the policy's ``blocks()``). Composite: the parts' under their paths."""

    blocks: Sequence[tuple[str, object]] | None = None

    @classmethod
    def merge(cls, own: ChecksSpec | None, parts: Mapping[str, ChecksSpec]) -> ChecksSpec:
        own = own or cls()
        if own.blocks is None and all(p.blocks is None for p in parts.values()):
            return cls()
        found = [*(own.blocks or ())]
        found += [(under(path, n), m) for path, p in parts.items() for n, m in (p.blocks or ())]
        return cls(blocks=found)
