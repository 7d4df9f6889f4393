"""The meta-device guard: a model built on ``meta`` refuses to run until its weights are loaded."""

from __future__ import annotations

from torch import nn

__all__ = ["guard_meta", "unguard_meta"]


def guard_meta(model: nn.Module) -> None:
    """Refuse to run a model whose weights are still on the meta device, with the fix."""
    if not any(p.is_meta for p in model.parameters()) or getattr(model, "_shardcore_meta_guard", None):
        return

    def hook(module, args, kwargs):
        raise RuntimeError(
            f"{type(module).__name__} was built on the meta device and has no weights yet: load them with "
            "shardcore.load_checkpoint(model, path) before running it (lazy initialization is for loading "
            "checkpoints; random init on meta is not supported)"
        )

    model._shardcore_meta_guard = model.register_forward_pre_hook(hook, with_kwargs=True)


def unguard_meta(model: nn.Module) -> None:
    handle = getattr(model, "_shardcore_meta_guard", None)
    if handle is not None and not any(p.is_meta for p in model.parameters()):
        handle.remove()
        model._shardcore_meta_guard = None
