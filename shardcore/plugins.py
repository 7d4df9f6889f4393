"""Plugin discovery (entry-point group ``"shardcore"``) and lazy policy resolution.

Discovery imports each plugin's module (cheap by contract) and records the *locations* of the
policies it registers; a policy module is imported only when a model it covers is optimized.
A plugin whose requirements are missing, or that fails to import or register, is recorded with
its name and the reason and skipped; the others keep working.

``SHARDCORE_DISABLE_PLUGINS`` (comma-separated entry-point names, or ``all``) switches plugins off.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import warnings
from collections.abc import Mapping
from typing import Any

import attrs
import pluggy
from torch import nn

from . import hookspecs
from .hookspecs import NAME
from .policy import Policy

__all__ = ["NoPolicyError", "PluginInfo", "PluginRegistry", "get_policy", "get_registry", "qualname"]


class NoPolicyError(LookupError):
    """No installed plugin covers the model's class (nor any of its base classes)."""


class PolicyLoadError(ImportError):
    """A plugin registered a policy location that cannot be imported."""


def qualname(cls: type) -> str:
    """The key a model class is registered under: ``module.QualName``."""
    return f"{cls.__module__}.{cls.__qualname__}"


@attrs.define
class PluginInfo:
    name: str
    distribution: str | None = None
    version: str | None = None
    models: list[str] = attrs.field(factory=list)
    error: str | None = None


@attrs.frozen
class _Entry:
    plugin: str
    policy: Any  # a Policy subclass or a "module:Class" location


def _unmet_requirements(dist: md.Distribution) -> list[str]:
    """Requirements of ``dist`` (without extras) that are not installed at a matching version."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging is a core dependency
        return []
    unmet = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req} (found {version})")
    return unmet


class PluginRegistry:
    """The plugins of this process and the model classes they cover."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(NAME)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.entries: dict[str, _Entry] = {}
        self._loaded = False

    # ---- loading --------------------------------------------------------------------------
    def load(self) -> PluginRegistry:
        """Discover entry-point plugins once (idempotent)."""
        if self._loaded:
            return self
        self._loaded = True
        disabled = {n.strip() for n in os.environ.get("SHARDCORE_DISABLE_PLUGINS", "").split(",") if n.strip()}
        for ep in md.entry_points(group=NAME):
            if "all" in disabled or ep.name in disabled or ep.name in self.plugins:
                continue
            dist = getattr(ep, "dist", None)
            info = PluginInfo(ep.name, dist.name if dist else None, dist.version if dist else None)
            self.plugins[ep.name] = info
            unmet = _unmet_requirements(dist) if dist is not None else []
            if unmet:
                info.error = "unmet requirements: " + ", ".join(unmet)
                continue
            try:
                module = ep.load()
            except Exception as exc:  # a broken plugin must not break the others
                info.error = f"import failed: {type(exc).__name__}: {exc}"
                continue
            self._add(module, info)
        return self

    def register(self, plugin: object, name: str | None = None) -> PluginInfo:
        """Register a plugin object (a module or an object with ``@hookimpl`` methods) directly."""
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        info = PluginInfo(name)
        self.plugins[name] = info
        self._add(plugin, info)
        return info

    def unregister(self, name: str) -> None:
        """Remove a plugin registered under ``name`` and the model classes it covered."""
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin, name=name)
        self.plugins.pop(name, None)
        for key in [k for k, e in self.entries.items() if e.plugin == name]:
            del self.entries[key]

    def _add(self, module: object, info: PluginInfo) -> None:
        try:
            self.pm.register(module, name=info.name)
            self.pm.check_pending()
        except Exception as exc:
            if self.pm.get_plugin(info.name) is not None:
                self.pm.unregister(name=info.name)
            info.error = f"invalid plugin: {type(exc).__name__}: {exc}"
            return
        impls = [i for i in self.pm.hook.shardcore_register_policies.get_hookimpls() if i.plugin_name == info.name]

        def register(model_qualname: str | Mapping[str, str | type], policy: str | type | None = None) -> None:
            if isinstance(model_qualname, Mapping) and policy is None:
                for name, location in model_qualname.items():
                    register(name, location)
                return
            if not isinstance(model_qualname, str) or "." not in model_qualname:
                raise TypeError(f"register() takes the model's 'module.ClassName', got {model_qualname!r}")
            if not isinstance(policy, str | type):
                raise TypeError(f"register() takes a Policy subclass or a 'module:Class' location, got {policy!r}")
            if isinstance(policy, str) and ":" not in policy:
                raise ValueError(f"policy location {policy!r} must look like 'package.module:PolicyClass'")
            info.models.append(model_qualname)
            self.entries.setdefault(model_qualname, _Entry(info.name, policy))

        for impl in impls:
            try:
                impl.function(register=register)
            except Exception as exc:
                info.error = f"shardcore_register_policies failed: {type(exc).__name__}: {exc}"
                for key in [k for k, e in self.entries.items() if e.plugin == info.name]:
                    del self.entries[key]
                info.models.clear()

    # ---- resolution -----------------------------------------------------------------------
    def find(self, model_cls: type) -> tuple[str, _Entry] | None:
        """The first class in ``model_cls``'s MRO that a plugin covers, and its entry."""
        self.load()
        for cls in model_cls.__mro__:
            entry = self.entries.get(qualname(cls))
            if entry is not None:
                return qualname(cls), entry
        return None

    def get_policy(self, model: nn.Module) -> Policy:
        """A fresh policy instance for ``model``, importing its module now."""
        found = self.find(type(model))
        if found is None:
            raise NoPolicyError(self._no_policy_message(type(model)))
        key, entry = found
        policy = entry.policy
        if isinstance(policy, str):
            module_name, _, attr = policy.partition(":")
            try:
                policy = getattr(importlib.import_module(module_name), attr)
            except Exception as exc:
                raise PolicyLoadError(
                    f"plugin {entry.plugin!r} registered policy {entry.policy!r} for {key}, but it cannot be "
                    f"loaded: {type(exc).__name__}: {exc}"
                ) from exc
        if not (isinstance(policy, type) and issubclass(policy, Policy)):
            raise TypeError(
                f"plugin {entry.plugin!r} registered {policy!r} for {key}, which is not a shardcore.Policy subclass"
            )
        return policy()

    def _no_policy_message(self, cls: type) -> str:
        ok = [p for p in self.plugins.values() if p.error is None]
        broken = [p for p in self.plugins.values() if p.error is not None]
        lines = [f"No shardcore policy covers {qualname(cls)} (nor its base classes)."]
        if ok:
            lines.append(
                "Installed plugins: "
                + "; ".join(
                    f"{p.name} ({', '.join(m.rsplit('.', 1)[-1] for m in p.models) or 'no models'})" for p in ok
                )
            )
        else:
            lines.append("No shardcore plugin is installed.")
        lines += [f"Plugin {p.name!r} failed to load: {p.error}" for p in broken]
        lines.append(
            "Install the plugin for this model family (e.g. `pip install shard-llama`), or pass a policy "
            "of your own: shardcore.optimize(model, config, policy=MyPolicy())."
        )
        return "\n".join(lines)


_REGISTRY: PluginRegistry | None = None


def get_registry() -> PluginRegistry:
    """The process-wide registry, discovering plugins on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = PluginRegistry()
    return _REGISTRY.load()


def reset_registry() -> None:
    """Forget discovered plugins (the next :func:`get_registry` discovers again)."""
    global _REGISTRY
    _REGISTRY = None


def get_policy(model: nn.Module) -> Policy:
    return get_registry().get_policy(model)


def warn_broken_plugins(model_name: str, fallback: object) -> None:
    """A model no loaded plugin covers falls back to zero-config (``fallback`` is its policy, or
    ``None``): if any plugin failed to load, say so loudly, naming each and its error."""
    broken = [p for p in get_registry().plugins.values() if p.error is not None]
    if fallback is not None and broken:
        warnings.warn(
            f"shardcore: no loaded plugin covers {model_name}, so it is sharded by the plan its config ships "
            "(zero-config); but "
            + "; ".join(f"the plugin {p.name!r} failed to load ({p.error})" for p in broken)
            + ". If one of them covers this model, fix it (`shardcore plugins` lists every plugin)",
            RuntimeWarning,
            stacklevel=4,
        )
