"""What a library's checkpoint format keeps a model's tensors as, read from the library's own
conversion mapping (transformers 5's ``conversion_mapping``, the one ``from_pretrained`` applies), so
that shard-on-read follows the library as it changes, not a table of ours:

* :func:`library_names`: tensors the library renames on loading (a Llava checkpoint's
  ``language_model.model.*`` is the model's ``model.language_model.*``);
* :func:`library_parts`: tensors the library fuses from pieces on loading (a mixture-of-experts layer's
  ``experts.gate_up_proj`` from each expert's ``gate_proj`` and ``up_proj``, the format the Hub holds),
  as :class:`~shardcore.checkpoint.parts.StackedParts` that each rank reads its slice of."""

from __future__ import annotations

import re
from collections import defaultdict

from torch import nn

from .parts import StackedParts

__all__ = ["library_names", "library_parts"]


def _transforms(model: nn.Module) -> tuple[list, list]:
    """``(renamings, converters)`` transformers applies when it loads ``model``; none for other models."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming
    except ImportError:  # not transformers 5, or no transformers
        return [], []
    try:
        transforms = get_model_conversion_mapping(model)
    except Exception:  # not a PreTrainedModel: no library naming
        return [], []
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    return renamings, [t for t in transforms if isinstance(t, WeightConverter)]


def _renamed(key: str, renamings: list) -> str:
    for rename in renamings:
        key = rename.rename_source_key(key)[0]
    return key


def library_names(model: nn.Module, keys) -> dict[str, str]:
    """``{model name: checkpoint key}`` of ``keys`` the model's library renames when it loads them.
    Only plain renames: the tensors it fuses from pieces are :func:`library_parts`'."""
    renamings, _ = _transforms(model)
    out = {}
    for key in keys:
        name = _renamed(key, renamings)
        if name != key:
            out[name] = key
    return out


def _stacking(converter) -> int | None:
    """The entry dimension pieces are concatenated along when ``converter`` stacks one tensor per
    index (``MergeModulelist(dim=0)``, then ``Concatenate(dim=d)`` of several sources: ``d - 1``);
    ``None`` for any other operation, which shardcore does not read."""
    ops = [(type(op).__name__, getattr(op, "dim", None)) for op in converter.operations]
    if ops == [("MergeModulelist", 0)]:
        return 0
    if len(ops) == 2 and ops[0] == ("MergeModulelist", 0) and ops[1][0] == "Concatenate" and ops[1][1] >= 1:
        return ops[1][1] - 1
    return None


def _with_prefix(name: str, prefix: str) -> list[str]:
    """``name`` as is, under the base model's prefix, and without it (a base model read from a full model's file)."""
    if not prefix:
        return [name]
    return [name, f"{prefix}.{name}", name.removeprefix(f"{prefix}.")]


def library_parts(model: nn.Module, keys, names) -> tuple[dict[str, StackedParts], dict[str, str]]:
    """``({model name: StackedParts}, {model name: why not})`` for model tensors ``names`` the library
    fuses from checkpoint ``keys`` when it loads them: stacked per index (an expert's) and concatenated
    as its converter says; a tensor fused by another operation is named with it (left missing)."""
    renamings, converters = _transforms(model)
    if not converters:
        return {}, {}
    wanted, prefix = set(names), getattr(model, "base_model_prefix", "")
    found: dict[str, tuple] = {}
    pieces: dict[str, dict[tuple[int, int], str]] = defaultdict(dict)  # {name: {(source, index): key}}
    for key in keys:
        renamed = _renamed(key, renamings)
        for converter in converters:
            target, pattern = converter.rename_source_key(renamed)
            if pattern is None:
                continue
            target = next((t for t in _with_prefix(target, prefix) if t in wanted), target)
            index = re.search(re.escape(pattern.lstrip("^")).replace(r"\*", r"(\d+)"), renamed)
            if target in wanted and index is not None and index.groups():
                found[target] = converter
                pieces[target][converter.source_patterns.index(pattern), int(index.group(1))] = key
            break  # at most one converter takes a key, as in transformers
    parts, why = {}, {}
    for name, converter in found.items():
        cat_dim, sources = _stacking(converter), len(converter.source_patterns)
        indices = sorted({i for _, i in pieces[name]})
        if cat_dim is None:
            why[name] = f"transformers fuses it by {[type(op).__name__ for op in converter.operations]}"
        elif indices == list(range(len(indices))) and len(pieces[name]) == sources * len(indices):
            keys_of = tuple(tuple(pieces[name][s, i] for s in range(sources)) for i in indices)
            parts[name] = StackedParts(keys_of, cat_dim=cat_dim)
        else:
            why[name] = f"its pieces {converter.source_patterns} are not all in the checkpoint for indices {indices}"
    return parts, why
