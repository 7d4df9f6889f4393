"""Names that moved keep working, warned: plugin authors import from shardcore, and a moved import
must not break their plugin before the release its warning names.

:func:`moved_names` makes a module's ``__getattr__`` (PEP 562) for the names that left it: reading
one warns with a ``DeprecationWarning`` naming the new import, every time (a module ``__getattr__``
runs at each read), and returns the new module's own object, imported by name at that read (the new
home may sit above the old one in the core's tiers, so the old module never imports it at load).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable

__all__ = ["STAGE_ATTRIBUTES", "moved_names", "renamed", "stage_facts_of", "warn_stage_attributes"]


def moved_names(old: str, new: str, names: Iterable[str], *, until: str = "0.3") -> Callable[[str], object]:
    """The ``__getattr__`` of module ``old`` for ``names``, which moved to module ``new``; any other
    missing name raises the usual ``AttributeError``."""
    names = frozenset(names)

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {new}.{name}: import it from there (the old name goes away in {until})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__


def renamed(module: str, names: dict[str, str], *, hint: str = "", until: str = "0.3") -> Callable[[str], object]:
    """The ``__getattr__`` of ``module`` for its own names that were renamed (``{old: new}``): reading an
    old one warns naming the new and returns it."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = names[name]
        warnings.warn(
            f"{module}.{name} is {module}.{new} now"
            + (f": {hint}" if hint else "")
            + f" (the old name goes away in {until})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), new)

    return __getattr__


#: 0.1's class attributes of an ``HFStages`` policy -> the :class:`~shardcore.plugin_api.StageFacts` field each is now
STAGE_ATTRIBUTES = {
    "first_ends": "first_ends",
    "last_ends": "last_ends",
    "zero_ends": "zero_ends",
    "heads": "heads",
    "stage_inputs": "inputs",
    "stage_first_inputs": "first_inputs",
    "stage_call": "call",
    "stage_ignored": "ignored",
    "stage_loss": "loss",
    "stage_output": "output",
    "stage_block_returns_tuple": "block_returns_tuple",
    "stage_generate_refusal": "generate_refusal",
}


def warn_stage_attributes(cls: type, *, until: str = "0.3") -> None:
    """Warn when ``cls`` (an ``HFStages`` policy) declares 0.1's stage attributes, naming the value that says it now."""
    old = [name for name in STAGE_ATTRIBUTES if name in vars(cls)]
    if old and "stages" not in vars(cls):
        fields = ", ".join(f"{STAGE_ATTRIBUTES[name]}=..." for name in old)
        warnings.warn(
            f"{cls.__qualname__} declares 0.1's HFStages attributes {old}: return "
            f"shardcore.plugin_api.StageFacts({fields}) from its stages() instead (read until {until})",
            DeprecationWarning,
            stacklevel=3,
        )


def stage_facts_of(policy) -> object:
    """The ``StageFacts`` of a policy that does not override ``stages()``: the defaults, with any of 0.1's
    attributes its class declares (:data:`STAGE_ATTRIBUTES`, a property read on the policy) read into it."""
    facts = importlib.import_module("shardcore.integrations.hf.stages").StageFacts
    declared = {new: getattr(policy, old) for old, new in STAGE_ATTRIBUTES.items() if hasattr(type(policy), old)}
    return facts(**declared)
