"""Where a plan's split outputs go: the column-split layers whose output leaves the model.

A column-parallel layer (``[tp, null]``) leaves its output split over the group on its last
dimension; inside a block, the row-parallel layer after it reads that split. A split that reaches
the model's output with no row-parallel layer in between (a language model's head, a classifier,
any projection the model returns) must be gathered there, or the user gets one rank's slice as if it
were the whole tensor. Which layers those are is read from the model itself, whatever its library:
it runs once, unsharded, on a small input (:mod:`shardcore.inputs`), and its autograd graph is
walked from every tensor it returns back towards its inputs, stopping at the row-parallel layers'
outputs; each column-split layer whose output is reached on the way leaves the model.

A model that cannot be run (no input found, a forward that raises) is read by its structure
instead: a column-split layer sharing no block (a path up to a numbered part: ``blocks.3``) with a
row-parallel layer leaves the model. The block check at ``optimize`` (:mod:`shardcore.verify`)
then compares the sharded model's output with the unsharded one's either way.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from ..inputs import Inputs, evaluating
from .registry import find_style

__all__ = ["check_activations", "leaving", "repeated", "roles"]

log = logging.getLogger("shardcore")


def repeated(container: nn.Module) -> bool:
    """Whether ``container`` holds a model's repeated blocks: an ``nn.ModuleList``, or an
    ``nn.Sequential`` of two or more modules of one class that have modules of their own."""
    if isinstance(container, nn.ModuleList):
        return len(container) > 0
    if not isinstance(container, nn.Sequential) or len(container) < 2:
        return False
    return len({type(b) for b in container.children()}) == 1 and any(True for _ in container[0].children())


def roles(by_module: dict[str, dict], styles: dict[str, tuple[str, str]], modules: dict) -> tuple[list, list]:
    """``(column-split modules, modules reducing a split)`` of a plan: linears whose weight is split
    on dim 0 / dim 1 (``{path: {"weight": (key, spec)}}``), and the modules given styles that do the same."""
    columns, rows = [], []
    for path, entries in by_module.items():
        spec = entries.get("weight", (None, None))[1]
        if isinstance(modules[path], nn.Linear) and spec and any(a is not None for a in spec):
            (columns if spec[0] is not None else rows).append(path)
    for path, (_, style) in styles.items():  # a style's role: its output split on the last dimension / reduced
        role = getattr(find_style(style), "role", "")
        if role == "column":
            columns.append(path)
        elif role == "row":
            rows.append(path)
    return columns, rows


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors a model returned: at any depth of tuples, lists, dicts (HF's outputs) and dataclasses."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name, None))]
    return []


def leaving(
    model: nn.Module, columns: list[str], rows: list[str], inputs: Inputs | None, why_not: str = ""
) -> tuple[set[str], str]:
    """``(the columns whose split output leaves the model, how that was found)``; see the module docstring."""
    if not columns:
        return set(), "no column-split layer"
    if inputs is not None:
        try:
            return _by_graph(model, columns, rows, inputs), f"the model run on {inputs.source}"
        except Exception as err:  # a model that cannot run here: its structure decides
            why_not = f"running it on {inputs.source} raised {type(err).__name__}: {err}"
    log.info("shardcore: %s: where split outputs go is read from its blocks (%s)", type(model).__name__, why_not)
    return _by_structure(columns, rows), f"the model's blocks ({why_not})"


def _by_graph(model: nn.Module, columns: list[str], rows: list[str], inputs: Inputs) -> set[str]:
    modules = dict(model.named_modules())
    marks: dict[Any, tuple[str, str]] = {}  # {autograd node of a layer's output: ("column" | "row", path)}; holds them

    def hook(kind: str, path: str):
        def record(module, args, output):
            for t in _tensors(output):
                if t.grad_fn is not None:
                    marks.setdefault(t.grad_fn, (kind, path))

        return record

    handles = [modules[p].register_forward_hook(hook("column", p)) for p in columns]
    handles += [modules[p].register_forward_hook(hook("row", p)) for p in rows]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    try:
        for p in frozen:  # every layer's output on the graph, even a frozen model's
            p.requires_grad_(True)
        with evaluating(model), torch.enable_grad():
            out = inputs(model)
        roots = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        if not roots:
            raise ValueError("its output has no tensor on the autograd graph to walk back from")
        found = _walk(roots, marks)
        row_inputs = [n for node, (kind, _) in marks.items() if kind == "row" for n, _ in node.next_functions]
        both = found & _walk(row_inputs, marks)
        if both:  # returned and read by a row layer (a key/value cache it returns): stays split, as the plugins'
            log.warning(
                "shardcore: %s: %s feed row-parallel layers and also leave the model; their returned output stays "
                "each rank's split (as a key/value cache of its heads does)",
                type(model).__name__,
                ", ".join(sorted(both)),
            )
        return found - both
    finally:
        for h in handles:
            h.remove()
        for p in frozen:
            p.requires_grad_(False)


def _walk(roots: list, marks: dict) -> set[str]:
    """The columns reached from ``roots`` back through the graph, not through a row's output."""
    found: set[str] = set()
    seen: set = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        kind, path = marks.get(node, ("", ""))
        if kind == "column":
            found.add(path)
            continue
        if kind == "row":  # the split was reduced here
            continue
        stack.extend(n for n, _ in node.next_functions)
    return found


def _by_structure(columns: list[str], rows: list[str]) -> set[str]:
    out = set()
    for col in columns:
        parts = col.split(".")
        # the closest block holding it: the path up to its last numbered part (blocks.3, encoder_layer_3)
        numbered = [i for i in range(len(parts) - 2, -1, -1) if parts[i][-1:].isdigit()]
        owner = ".".join(parts[: numbered[0] + 1]) if numbered else None
        if owner is None or not any(r.startswith(f"{owner}.") for r in rows):
            out.add(col)
    return out


def check_activations(plan, activations: list, plans: dict[str, tuple[type, dict, str]]) -> None:
    """A plan's activation specs (``{key: spec}`` naming a module's output) against the layers it
    makes: a disagreement is a :class:`~shardcore.plan.PlanError`, never ignored."""
    from ..tensor_parallel import Linear1D_Col, VocabParallelLMHead1D
    from .syntax import PlanError

    for key, path, index, spec in activations:
        layer, kwargs = plans.get(path, (None, {}))[:2]
        gathered = kwargs.get("gather_output", layer is VocabParallelLMHead1D)
        split_last = layer in (Linear1D_Col, VocabParallelLMHead1D) and not gathered  # stays split over tp
        if spec is None:
            continue
        if isinstance(spec, str):
            raise PlanError(f"{plan.where(key)}: {key!r}: a style names a module, not one element of its output")
        expected = "split over tp on its last dimension" if split_last else "replicated (all null)"
        given_split = [i for i, a in enumerate(spec) if a is not None]
        ok = (given_split == [len(spec) - 1]) if split_last else not given_split
        if not ok:
            at = f"{path}[{index}]" if index is not None else path
            left = " (a split leaving the model is gathered unless ShardConfig(parallel_output=True))"
            raise PlanError(
                f"{plan.where(key)}: {key!r}: {at}'s output is {expected} under this plan, "
                f"the activation spec says {spec}{left if layer is VocabParallelLMHead1D else ''}"
            )
