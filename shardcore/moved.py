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

__all__ = ["moved_names", "renamed"]


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
