"""An attention module's own mask builder: a method of the module that makes the mask it hands the
attention function out of what runs along the sequence (Doge's dynamic mask, one bias per key and
key/value head from its value states, kept to the ``keep_window_size`` largest).

Under a sequence split such a method would see a rank's part of the keys beside the whole sequence's
mask. :mod:`shardcore.sequence.gathered` runs it over the whole sequence instead (its tensor arguments
gathered), so the attention function gets the whole mask, as it gets the model's causal mask. Read from
the source, no forward run: the call ``x = self.<method>(..., attention_mask=attention_mask, ...)`` in the
attention module's forward, ``<method>`` a function of its class, ``x`` (or what it is made again from it)
handed to the attention function as its mask.
"""

from __future__ import annotations

import ast
import functools
import inspect

import torch

from .attention import _names_mask, _registry_forward

__all__ = ["mask_builders"]


def mask_builders(model: torch.nn.Module) -> list[tuple[str, str]]:
    """``(module name, method)`` for each attention module of ``model`` whose forward builds the mask it
    hands the attention function with a method of its own that takes the model's mask
    (:func:`_builder`)."""
    return [(name, method) for name, m in model.named_modules() if (method := _builder(type(m)))]


@functools.cache
def _builder(cls: type) -> str | None:
    """The name of ``cls``'s method building the attention function's mask from the model's, ``None`` where
    its forward has no such call (or uses the mask otherwise too)."""
    source = _registry_forward(cls)
    if source is None:
        return None
    tree = ast.parse(source)
    built = {}  # name assigned -> method of cls whose result it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            method = _own_call(cls, node.value)
            if method is not None:
                built[node.targets[0].id] = method
    handed = _handed_mask(tree)
    return built.get(handed) if handed else None


def _own_call(cls: type, node: ast.AST) -> str | None:
    """``m`` where ``node`` is ``self.m(...)`` taking the attention mask and ``m`` is a function of ``cls``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
        return None
    if not any(map(_names_mask, [*node.args, *(k.value for k in node.keywords)])):
        return None
    name = node.func.attr
    return name if inspect.isfunction(inspect.getattr_static(cls, name, None)) else None


def _handed_mask(tree: ast.AST) -> str | None:
    """The variable the forward hands ``attention_interface`` as its mask (the fifth positional argument
    or ``attention_mask=``), ``None`` where it is no plain name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "attention_interface":
            given = [k.value for k in node.keywords if k.arg == "attention_mask"] + node.args[4:5]
            if given and isinstance(given[0], ast.Name):
                return given[0].id
    return None
