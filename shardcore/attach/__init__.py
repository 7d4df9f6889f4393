"""What ``optimize`` attaches to a model, in one place: :func:`attached` (``model.shardcore.attached``).

Every hook around the model's forward and every method ``optimize`` replaces on the instance goes through
the model's :class:`Attached`, recorded with its name and the optimize step that attached it:

* hooks before and after the forward run from ONE dispatcher each. The core's own run in the order of
  :data:`BEFORE_FORWARD` and :data:`AFTER_FORWARD`; any other (a plugin's) declares its place with
  ``before=`` / ``after=`` (the names of the hooks it runs before / after), not with ``prepend=True`` and a
  comment, and not by an edit here. ``scope`` brackets them all (first before the forward, last after it);
  among the orders the constraints allow, a plugin's hook runs as early as they let it, ties by name, so
  the order never depends on which feature attached first. The dispatchers run before (after) the hooks
  torch's own data parallelism puts on the model (FSDP's parameter swaps), re-placed so at the end of
  ``optimize`` (:mod:`shardcore.attach.order`);
* ``forward``, ``generate`` and the other replaced methods (``clip_grad_norm_``, ``save_pretrained``,
  ``loss_function``) are routed through one chain each: each feature gives a wrapper of what was there
  before it, the registry sets the one composed function on the instance.

``print(model.shardcore)`` (or ``model.shardcore.attached.describe()``) lists them in the order they run,
and torch's own hooks found on the model beside them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from .listing import hook_name, inside
from .order import AFTER_FORWARD, BEFORE_FORWARD, BRACKET, CORE, attached_too, order, places

__all__ = ["AFTER_FORWARD", "BEFORE_FORWARD", "Attached", "Entry", "attached", "attachments", "hook_name"]


@dataclass
class Entry:
    """One attachment: ``kind`` is ``"before"``, ``"after"`` or the name of a routed method."""

    kind: str
    name: str
    step: str
    fn: Callable
    with_kwargs: bool = False
    always: bool = False
    what: str = ""
    #: the hooks (of the same kind) this one runs before / after: a plugin's hook's declared place
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    def line(self) -> str:
        flags = " (always, also after a forward that raised)" if self.always else ""
        place = [f"after {', '.join(self.after)}"] if self.after else []
        place += [f"before {', '.join(self.before)}"] if self.before else []
        flags += f" ({'; '.join(place)})" if place else ""
        return f"{self.name} [{self.step}]{flags}" + (f": {self.what}" if self.what else "")


@dataclass
class Attached:
    """The registry of one model's attachments (module docstring)."""

    owner: str
    #: the model (a weak reference: the registry lives on it)
    model: Callable[[], nn.Module | None] = lambda: None
    #: the optimize step running now (set by ``optimize``; attachments after it: ``"after optimize"``)
    step: str = "after optimize"
    entries: list[Entry] = field(default_factory=list)
    _ran: list = field(default_factory=list)  # the entries the last (outermost) forward ran
    _running: dict = field(default_factory=dict)  # {"before" / "after": entries in run order}, kept as they change
    _handles: list = field(default_factory=list)
    _calls: list = field(default_factory=list)  # per forward in flight: whether it returned (after-hooks)
    _originals: dict = field(default_factory=dict)
    #: ``{method: the function the registry set on the model}`` (what ``getattr(model, method)`` must be)
    installed: dict = field(default_factory=dict)

    # -- hooks around the forward ---------------------------------------------------------------------

    def before_forward(
        self,
        model: nn.Module,
        name: str,
        fn: Callable,
        *,
        with_kwargs: bool = False,
        what: str = "",
        before: str | tuple[str, ...] = (),
        after: str | tuple[str, ...] = (),
    ):
        """Run ``fn(module, args[, kwargs])`` before each forward: at ``name``'s place in :data:`BEFORE_FORWARD`,
        or (any other name) at the place ``before`` / ``after`` declare (hook names; see the module docstring)."""
        self._add(model, Entry("before", name, self.step, fn, with_kwargs, False, what, *places(before, after)))

    def after_forward(
        self,
        model: nn.Module,
        name: str,
        fn: Callable,
        *,
        with_kwargs: bool = False,
        always: bool = False,
        what: str = "",
        before: str | tuple[str, ...] = (),
        after: str | tuple[str, ...] = (),
    ):
        """Run ``fn(module, args, [kwargs,] output)`` after each forward: at ``name``'s place in
        :data:`AFTER_FORWARD`, or (any other name) at the place ``before`` / ``after`` declare."""
        self._add(model, Entry("after", name, self.step, fn, with_kwargs, always, what, *places(before, after)))

    def remove(self, model: nn.Module, kind: str, name: str) -> None:
        """Drop the attachment ``name`` of ``kind`` (``"before"``, ``"after"``, or a routed method, which
        goes back to what was there before the chain)."""
        self.entries = [e for e in self.entries if not (e.kind == kind and e.name == name)]
        self._running = {kind: self.in_order(kind) for kind in ("before", "after")}
        if kind not in ("before", "after"):
            self._install_route(model, kind)

    def has(self, kind: str, name: str) -> bool:
        return any(e.kind == kind and e.name == name for e in self.entries)

    def _add(self, model: nn.Module, entry: Entry) -> None:
        if self.has(entry.kind, entry.name):
            raise ValueError(f"{self.owner}: a {entry.kind}-forward hook {entry.name!r} is attached already")
        known = set(CORE[entry.kind]) | {e.name for e in self.entries if e.kind == entry.kind}
        if entry.name not in CORE[entry.kind] and not known & {*entry.before, *entry.after}:
            raise ValueError(
                f"{self.owner}: the {entry.kind}-forward hook {entry.name!r} has no place: declare it with "
                f"before= / after= naming at least one hook it runs {entry.kind} the forward with (shardcore's: "
                f"{', '.join(CORE[entry.kind])}{attached_too(known - set(CORE[entry.kind]))}), "
                f"e.g. after={BRACKET!r}" + (f", before={BRACKET!r}" if entry.kind == "after" else "")
            )
        self.entries.append(entry)
        try:
            self._running = {kind: self.in_order(kind) for kind in ("before", "after")}
        except ValueError:
            self.entries.remove(entry)
            raise
        if not self._handles:
            self.settle(model)

    def in_order(self, kind: str) -> list[Entry]:
        """This kind's entries in the order they run: the core's order, every declared ``before`` / ``after``,
        ``scope`` bracketing the rest; a plugin's hook as early as that allows (ties by name)."""
        entries = {e.name: e for e in self.entries if e.kind == kind}
        return [entries[name] for name in order(kind, entries) if name in entries]

    def settle(self, model: nn.Module) -> None:
        """(Re-)register the dispatchers: the one before the forward first among the model's own pre-hooks,
        those after it last (``optimize`` calls this last, after torch's data parallelism added its hooks)."""
        for handle in self._handles:
            handle.remove()
        self._handles = [
            model.register_forward_pre_hook(self._before, with_kwargs=True, prepend=True),
            model.register_forward_hook(self._returned, with_kwargs=True),
            model.register_forward_hook(self._after, with_kwargs=True, always_call=True),
        ]

    @property
    def last_run(self) -> list[str]:
        """``"before:name"`` / ``"after:name"`` of what the last forward ran, in order (the outermost one: a
        pipeline stage runs the model inside its own forward): what :meth:`describe` says must hold."""
        return [f"{e.kind}:{e.name}" for e in self._ran]

    @property
    def dispatchers(self) -> tuple[Callable, Callable, Callable]:
        """The hooks the registry puts on the model: before the forward, after it (normal), after it (always)."""
        return self._before, self._returned, self._after

    def finish(self, model: nn.Module) -> None:
        """The end of ``optimize``: what is attached from now on is attached after it; :meth:`settle`."""
        self.step = "after optimize"
        self.settle(model)

    def _before(self, module, args, kwargs):
        outer = not self._calls  # not a forward of the model inside its own (a pipeline stage's)
        self._calls.append(False)
        if outer:
            self._ran = []
        for entry in self._running.get("before", ()):
            if outer:
                self._ran.append(entry)
            if entry.with_kwargs:
                out = entry.fn(module, args, kwargs)
                if out is not None:
                    args, kwargs = out
            else:
                out = entry.fn(module, args)
                if out is not None:
                    args = out if isinstance(out, tuple) else (out,)
        return args, kwargs

    def _returned(self, module, args, kwargs, output):
        if self._calls:
            self._calls[-1] = True  # the forward returned: every after-hook runs, not only the always ones

    def _after(self, module, args, kwargs, output):
        returned = self._calls.pop() if self._calls else True
        outer = not self._calls
        for entry in self._running.get("after", ()):
            if not (returned or entry.always):
                continue
            if outer:
                self._ran.append(entry)
            out = entry.fn(module, args, kwargs, output) if entry.with_kwargs else entry.fn(module, args, output)
            if out is not None and returned:
                output = out
        return output if returned else None

    # -- routed methods ---------------------------------------------------------------------------------

    def route(self, model: nn.Module, method: str, name: str, wrap: Callable[[Callable], Callable], *, what: str = ""):
        """Route ``model.<method>`` (``forward``, ``generate``, ``clip_grad_norm_``, ...) through ``wrap``:
        ``wrap(inner)`` returns the function run instead, given what ran before (the class's method, or
        the previous feature's function). The one composed function is set on the instance."""
        if self.has(method, name):
            raise ValueError(f"{self.owner}: {method} is routed through {name!r} already")
        if method not in self._originals:  # (the instance's own, or none: the class's; what it was)
            self._originals[method] = (model.__dict__.get(method, _CLASS), getattr(model, method, None))
        self.entries.append(Entry(method, name, self.step, wrap, what=what))
        self._install_route(model, method)

    def _install_route(self, model: nn.Module, method: str) -> None:
        own, value = self._originals[method]
        chain = [e for e in self.entries if e.kind == method]
        if chain or own is not _CLASS or isinstance(getattr(type(model), method, None), property):
            for entry in chain:
                value = entry.fn(value)
            object.__setattr__(model, method, value)  # a property (loss_function) takes it through its setter
            self.installed[method] = getattr(model, method)
        else:
            model.__dict__.pop(method, None)  # nothing routed any more: the class's own
            self.installed.pop(method, None)

    def routes(self) -> dict[str, list[Entry]]:
        """``{method: its chain, innermost first}``."""
        out: dict[str, list[Entry]] = {}
        for e in self.entries:
            if e.kind not in ("before", "after"):
                out.setdefault(e.kind, []).append(e)
        return out

    # -- what a user reads --------------------------------------------------------------------------------

    def describe(self) -> str:
        """Every attachment, in the order it runs, and torch's own hooks found on the model beside them."""
        model = self.model()
        lines = [f"what shardcore attached to {self.owner}, in the order it runs:", "  before each forward:"]
        lines += [f"    {i}. {e.line()}" for i, e in enumerate(self.in_order("before"), 1)]
        if model is not None:
            foreign = [h for h in model._forward_pre_hooks.values() if h != self._before]
            lines += [f"    then torch's own: {hook_name(h)}" for h in foreign]
        lines.append("  after each forward:")
        if model is not None:
            foreign = [h for h in model._forward_hooks.values() if h not in (self._returned, self._after)]
            lines += [f"    first torch's own: {hook_name(h)}" for h in foreign]
        lines += [f"    {i}. {e.line()}" for i, e in enumerate(self.in_order("after"), 1)]
        for method, chain in self.routes().items():
            names = " -> ".join(e.line() for e in reversed(chain))
            lines.append(f"  {method}: {names} -> the model's own" if method in _WRAPPING else f"  {method}: {names}")
        if model is not None:
            lines += inside(model)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


#: what a routed method's chain ends in
_WRAPPING = ("forward", "generate")
_CLASS = object()


def attachments(model: nn.Module) -> Attached | None:
    """``model``'s registry, or ``None`` when nothing was attached to it."""
    return model.__dict__.get("_shardcore_attached")


def attached(model: nn.Module) -> Attached:
    """``model``'s registry of attachments, made on first use."""
    found = model.__dict__.get("_shardcore_attached")
    if found is None:
        found = Attached(type(model).__name__, weakref.ref(model))
        object.__setattr__(model, "_shardcore_attached", found)
    return found
