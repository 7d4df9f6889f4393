"""What a stage holds in place of what other stages hold: :class:`PipelineHole`."""

from __future__ import annotations

import torch
from torch import nn


class PipelineHole(nn.Module):
    """What stands in a stage for a module another stage holds: no parameters; its forward hands
    its first input (the hidden states) through, as a tuple when the module it replaces returned
    one (``as_tuple``; a tuple of indices: those positional arguments, as T5's blocks hand on the
    position biases), or, with ``zero``, a zero to add (a skipped position embedding). Simple attributes of the replaced module (``attention_type``, ...) are kept,
    so the model's forward reads them as before."""

    def __init__(
        self,
        replaced: nn.Module | None = None,
        *,
        as_tuple: bool | tuple[int, ...] = False,
        where: str = "",
        zero: bool = False,
    ) -> None:
        super().__init__()
        self.as_tuple, self.where, self.zero = as_tuple, where, zero
        for key, value in (vars(replaced) if replaced is not None else {}).items():
            if not key.startswith("_") and key not in ("training", "as_tuple", "where", "zero"):
                if isinstance(value, str | int | float | bool | type(None)):
                    setattr(self, key, value)
        # what the model's forward may still read of the replaced module (ViT reads the patch
        # projection's dtype before its embedding runs): its submodules and tensors on meta, no memory
        self.__dict__["_stand_in"] = _stand_in(replaced, zero) if replaced is not None else None

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            stand_in = self.__dict__.get("_stand_in")
            if stand_in is None or not hasattr(stand_in, name):
                raise
            return getattr(stand_in, name)

    def forward(self, *args, **kwargs):
        # the hidden states: the first positional argument, or by keyword (an embedding module
        # skipped on a later stage is called with inputs_embeds=...)
        hidden = args[0] if args else kwargs.get("hidden_states", kwargs.get("inputs_embeds"))
        if self.zero:  # a term added to the hidden states (a position embedding): nothing to add
            hidden = torch.zeros(())
        if isinstance(self.as_tuple, tuple):  # what the block takes and returns changed, handed on unchanged
            return tuple(args[i] if i < len(args) else None for i in self.as_tuple)
        return (hidden,) if self.as_tuple else hidden

    def extra_repr(self) -> str:
        return f"held by another pipeline stage: {self.where}"


def _stand_in(module: nn.Module, zero: bool = False):
    """``module``'s attribute tree with its parameters and buffers as meta tensors (shape and dtype
    only), its submodules likewise, its simple attributes as they are. ``zero``: a term the model
    adds, whose tensors it may read directly (transformers 4.x Whisper adds
    ``embed_positions.weight``): they are zero scalars."""
    import types

    out = types.SimpleNamespace()
    for key, value in vars(module).items():
        if not key.startswith("_") and isinstance(value, str | int | float | bool | tuple | type(None)):
            setattr(out, key, value)
    for key, t in (*module._parameters.items(), *module._buffers.items()):
        if t is not None:
            setattr(out, key, torch.zeros((), dtype=t.dtype) if zero else torch.empty_like(t, device="meta"))
    for key, child in module._modules.items():
        if child is not None:
            setattr(out, key, _stand_in(child, zero))
    return out
