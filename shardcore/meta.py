"""The meta-device guard: a model built on ``meta`` refuses to run until its weights are loaded."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook

from .attach import attached, attachments

__all__ = ["guard_meta", "init_empty", "unguard_meta"]


@contextlib.contextmanager
def init_empty() -> Iterator[None]:
    """Build models with their parameters on the meta device and their buffers real.

    ``with shardcore.init_empty(): model = Model(config)`` allocates no weights (each parameter
    moves to ``meta`` as it is registered), while buffers are computed by the modules' own
    ``__init__`` as usual (rotary frequencies, position ids, causal masks), whatever the model
    library's version; persistent ones are then overwritten by :func:`shardcore.load_checkpoint`.
    Prefer it to ``with torch.device("meta")``, under which buffers must be recomputed after
    loading (see :attr:`CheckpointSpec.materialize <shardcore.spec.CheckpointSpec>`). Built on torch's own parameter
    registration hook, removed when the block ends, and limited to the thread running the block:
    ``nn.Module`` itself is never patched.
    """
    thread = threading.get_ident()

    def to_meta(module: nn.Module, name: str, param):
        if param is None or param.is_meta or threading.get_ident() != thread:
            return None
        return nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    handle = register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()


def guard_meta(model: nn.Module) -> None:
    """Refuse to run a model whose weights are still on the meta device, with the fix."""
    if not any(p.is_meta for p in model.parameters()) or attached(model).has("before", "meta_guard"):
        return

    def hook(module, args, kwargs):
        raise RuntimeError(
            f"{type(module).__name__} was built on the meta device and has no weights yet: load them with "
            "shardcore.load_checkpoint(model, path) before running it (lazy initialization is for loading "
            "checkpoints; random init on meta is not supported)"
        )

    attached(model).before_forward(model, "meta_guard", hook, with_kwargs=True, what="weights on meta refused")


def unguard_meta(model: nn.Module) -> None:
    found = attachments(model)
    if found is not None and found.has("before", "meta_guard") and not any(p.is_meta for p in model.parameters()):
        found.remove(model, "before", "meta_guard")
