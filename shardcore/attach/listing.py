"""What :meth:`shardcore.attach.Attached.describe` finds on a model beside the registry: torch's hooks and the
sharder's, named by function."""

from __future__ import annotations

from torch import nn

__all__ = ["hook_name", "inside"]


def inside(model: nn.Module) -> list[str]:
    """The hooks and replaced forwards (and other methods set on a module: an attention's mask builder run over
    the whole sequence) found on the model's submodules (the parallel layers' regions, the per-rank random streams,
    the sequence split), by function: what the sharder put inside the model."""
    found: dict[tuple[str, str], list[str]] = {}
    for path, module in model.named_modules():
        if not path:
            continue
        for kind, hooks in (("before", module._forward_pre_hooks), ("after", module._forward_hooks)):
            for hook in hooks.values():
                found.setdefault((kind, hook_name(hook)), []).append(path)
        for name, value in module.__dict__.items():  # a method set on the instance (forward, a mask builder)
            if callable(value) and not isinstance(value, nn.Module) and callable(getattr(type(module), name, None)):
                found.setdefault((name, hook_name(value)), []).append(path)
    if not found:
        return []
    lines = ["  inside the model (found on its modules):"]
    for (kind, name), paths in found.items():
        more = ", ..." if len(paths) > 3 else ""
        lines.append(f"    {kind} {name}: {len(paths)} modules ({', '.join(paths[:3])}{more})")
    return lines


def hook_name(hook) -> str:
    """``module.qualname`` of a hook function (a bound method's function, a partial's)."""
    fn = getattr(hook, "func", hook)  # functools.partial
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
