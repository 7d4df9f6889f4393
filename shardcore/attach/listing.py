"""What :meth:`shardcore.attach.Attached.describe` finds on a model beside the registry: torch's hooks and the
sharder's, named by function."""

from __future__ import annotations

from torch import nn

__all__ = ["hook_name", "inside"]


def inside(model: nn.Module) -> list[str]:
    """The hooks and replaced forwards found on the model's submodules (the parallel layers' regions, the
    per-rank random streams, the sequence split), by function: what the sharder put inside the model."""
    found: dict[tuple[str, str], list[str]] = {}
    for path, module in model.named_modules():
        if not path:
            continue
        for kind, hooks in (("before", module._forward_pre_hooks), ("after", module._forward_hooks)):
            for hook in hooks.values():
                found.setdefault((kind, hook_name(hook)), []).append(path)
        if "forward" in module.__dict__:
            found.setdefault(("forward", hook_name(module.__dict__["forward"])), []).append(path)
    if not found:
        return []
    lines = ["  inside the model (found on its modules):"]
    for (kind, name), paths in found.items():
        more = ", ..." if len(paths) > 3 else ""
        lines.append(f"    {kind} {name}: {len(paths)} modules ({', '.join(paths[:3])}{more})")
    return lines


def hook_name(hook) -> str:
    """``module.qualname`` of a hook function (a bound method's function)."""
    fn = getattr(hook, "__func__", hook)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
