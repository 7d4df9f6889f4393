"""The plan styles: one registry every reader of a plan reads (the parser, the layer builder, zero-config,
the flow analysis).

A style is a name a plan gives a module or a parameter in place of a spec (transformers' ``colwise``,
``moe_tp_experts``, ...). Each is one :class:`Style`: what a module given it becomes, how a bare
parameter given it is cut, what a plain ``nn.Linear`` / ``nn.Embedding``'s own parameter given it means as
a spec, and what the flow analysis sees of its output. shardcore's own are registered by
:mod:`shardcore.plan.styles`; a plugin adds one with :func:`register_style` (``shardcore.plugin_api``), or
declares it under the entry-point group ``shardcore.styles`` (``name = "module:STYLE"``) so a plan naming
it loads it when read, without the plugin imported first. A name no style has is refused by name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from torch import nn

__all__ = ["ENTRY_POINTS", "NOT_HERE", "Site", "Style", "find_style", "register_style", "style_names"]

#: the entry-point group a distribution declares its plan styles under (``name = "module:Style object"``)
ENTRY_POINTS = "shardcore.styles"

log = logging.getLogger("shardcore")


@dataclass(frozen=True)
class Site:
    """Where a style is applied to a module: what :attr:`Style.module` is given."""

    at: str  # the plan's key and line, for messages
    path: str  # the module's path in the model
    module: nn.Module
    parent: nn.Module | None
    config: Any  # the closest config (a composite's sub-model's)
    vocab_pad: int  # ShardConfig.make_vocab_size_divisible_by

    @property
    def plain_linear(self) -> bool:
        return isinstance(self.module, nn.Linear) and type(self.module).forward is nn.Linear.forward

    @property
    def plain_embedding(self) -> bool:
        return isinstance(self.module, nn.Embedding) and type(self.module).forward is nn.Embedding.forward


@dataclass(frozen=True)
class Style:
    """One plan style (see the module docstring). A field left ``None`` means the style does not apply
    there: the plan is refused naming the module or parameter and what the style applies to."""

    name: str
    #: a module given the style -> ``(layer class, kwargs)`` (the class's ``from_native_module(module,
    #: process_group, **kwargs)`` makes this rank's module; :class:`~shardcore.tensor_parallel.InPlace`
    #: keeps it and cuts its parameters), ``None`` to leave it whole, or :data:`NOT_HERE` for a module
    #: it does not apply to
    module: Callable[[Site], Any] | None = None
    #: a bare parameter given the style (``(name, parameter)``) -> ``(dim, packed parts)`` it is cut
    #: along, or ``None`` to keep it whole
    parameter: Callable[[str, nn.Parameter], tuple[int, int] | None] | None = None
    #: a plain ``nn.Linear`` / ``nn.Embedding``'s own ``weight`` / ``bias`` given the style -> its spec
    plain: Callable[[str], list | None] | None = None
    #: what the flow analysis sees: ``"column"`` (the module's output is split on its last dimension),
    #: ``"row"`` (the module reduces a split), ``""`` (neither)
    role: str = ""
    #: what a module given it must be, for the refusal (``"a plain nn.Linear"``)
    applies_to: str = "a plain nn.Linear or a bare parameter"


#: what :attr:`Style.module` returns for a module the style does not apply to
NOT_HERE = object()

_STYLES: dict[str, Style] = {}


def register_style(style: Style, *, replace: bool = False) -> Style:
    """Make ``style`` a name every plan may use; a second style of the same name is refused unless
    ``replace`` (a plugin's own fix of its own style)."""
    if not isinstance(style, Style):
        raise TypeError(f"register_style takes a shardcore.plugin_api.Style, got {type(style).__name__}")
    if style.role not in ("", "column", "row"):
        raise ValueError(f"style {style.name!r}: role {style.role!r} is not one of '', 'column', 'row'")
    if style.name in _STYLES and not replace and _STYLES[style.name] is not style:
        raise ValueError(f"a plan style {style.name!r} is registered already: pick another name")
    _STYLES[style.name] = style
    return style


def find_style(name: Any) -> Style | None:
    """The style of that name: registered, or declared under :data:`ENTRY_POINTS` (loaded now); ``None``."""
    if not isinstance(name, str):
        return None
    if name not in _STYLES:
        for point in entry_points(group=ENTRY_POINTS, name=name):
            style = point.load()
            if not isinstance(style, Style) or style.name != name:
                raise TypeError(
                    f"the entry point {point.value!r} ({ENTRY_POINTS}: {name}) is not a Style named {name!r}"
                )
            log.info("shardcore: the plan style %r from %s", name, point.value)
            register_style(style)
    return _STYLES.get(name)


def style_names() -> list[str]:
    """The names registered now (for messages)."""
    return list(_STYLES)
