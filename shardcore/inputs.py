"""A small input for any model: what the checks at ``optimize`` run the model on.

shardcore runs a model once before sharding it, to check a plan it did not write
(:mod:`shardcore.verify`) and to find where a plan's split outputs leave the model
(:mod:`shardcore.plan.flow`). The input is, in this order:

1. the user's: ``ShardConfig(example_inputs=...)``: a tensor (the one positional argument), a tuple
   (the positional arguments), a dict (keyword arguments), a pair ``(tuple, dict)`` (both), or a
   callable taking nothing that returns one of those (called once per use, so it may make fresh
   tensors);
2. a HuggingFace model's, by its conventions (``main_input_name``: token ids from the input
   embedding's vocabulary, or an image of the vision config's size) — a convention that only makes
   this faster, never the only way;
3. any model's, from its ``forward`` signature: its first parameter read as token ids when the
   model's first weighted module is an ``nn.Embedding`` (ids below its vocabulary), as an image when
   it is a convolution (its input channels; the size from the model's ``image_size`` / ``img_size``,
   else a few patches of the kernel), as features when it is an ``nn.Linear`` (its input width).

Every other parameter of ``forward`` must have a default, or the model is not run and the reason
says which parameter was missing and how to give it.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch import nn

__all__ = ["Inputs", "evaluating", "find_inputs"]


class Inputs:
    """``model(*args, **kwargs)``'s arguments, and where they came from (for messages)."""

    def __init__(self, args: tuple, kwargs: dict, source: str) -> None:
        self.args, self.kwargs, self.source = tuple(args), dict(kwargs), source

    def __call__(self, model: nn.Module) -> Any:
        return model(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"Inputs({self.source})"


def given(example: Any, source: str = "ShardConfig(example_inputs=...)") -> Inputs:
    """The user's example inputs (see the module docstring), as :class:`Inputs`."""
    value = example() if callable(example) and not isinstance(example, torch.Tensor) else example
    if isinstance(value, torch.Tensor):
        return Inputs((value,), {}, source)
    if isinstance(value, dict):
        return Inputs((), value, source)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple) and isinstance(value[1], dict):
        return Inputs(value[0], value[1], source)
    if isinstance(value, tuple | list):
        return Inputs(tuple(value), {}, source)
    raise TypeError(
        f"{source}: expected a tensor, a tuple of positional arguments, a dict of keyword arguments, a pair "
        f"(tuple, dict) or a callable returning one of those; got {type(value).__name__}"
    )


def find_inputs(model: nn.Module, example: Any = None, seed: int = 0) -> tuple[Inputs | None, str]:
    """``(inputs, "")``, or ``(None, why none was found)`` (see the module docstring); the user's
    ``example`` of a wrong kind raises, a model that cannot say its inputs is a reason."""
    if example is not None:
        return given(example), ""
    gen = torch.Generator().manual_seed(seed)
    try:
        hf = _hf_inputs(model, gen)
        return (hf, "") if hf is not None else _from_signature(model, gen)
    except Exception as err:  # a library's accessor that raises (get_input_embeddings not implemented)
        return None, f"finding an input raised {type(err).__name__}: {err}; pass ShardConfig(example_inputs=...)"


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """``model`` in eval mode for the ``with`` block, then every module back in its own mode (a frozen
    backbone left in eval by its user stays so)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s weights are (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _dtype(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _ids(vocab: int, gen: torch.Generator, device) -> torch.Tensor:
    ids = torch.randint(min(3, vocab - 1), vocab, (2, 8), generator=gen)
    return ids if device.type == "meta" else ids.to(device)


def _random(shape: tuple, gen: torch.Generator, device, dtype) -> torch.Tensor:
    if device.type == "meta":
        return torch.empty(shape, device="meta", dtype=dtype)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def _hf_inputs(model: nn.Module, gen: torch.Generator) -> Inputs | None:
    """A HuggingFace model's input by its conventions (``main_input_name``), ``None`` otherwise."""
    config = getattr(model, "config", None)
    name = getattr(model, "main_input_name", None)
    device = device_of(model)
    if name == "input_ids" and hasattr(model, "get_input_embeddings"):
        vocab = getattr(model.get_input_embeddings(), "num_embeddings", None)
        if not isinstance(vocab, int):
            return None
        ids = _ids(vocab, gen, device)
        kwargs = {"input_ids": ids}
        if getattr(config, "is_encoder_decoder", False) and takes(model, "decoder_input_ids"):
            kwargs["decoder_input_ids"] = ids[:, :6].clone()
    elif name == "pixel_values" and config is not None:
        vision = getattr(config, "vision_config", config)
        size = getattr(vision, "image_size", None)
        size = size[0] if isinstance(size, list | tuple) else size
        if not isinstance(size, int):
            return None
        kwargs = {
            "pixel_values": _random((2, getattr(vision, "num_channels", 3), size, size), gen, device, _dtype(model))
        }
    else:
        return None
    if config is not None and hasattr(config, "use_cache") and takes(model, "use_cache"):
        kwargs["use_cache"] = False
    return Inputs((), kwargs, f"{type(model).__name__}'s {name} (HuggingFace's main_input_name)")


def takes(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` takes the keyword ``name`` (or any keyword)."""
    params = inspect.signature(model.forward).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _first_weighted(model: nn.Module) -> nn.Module | None:
    """The model's first module (in registration order) holding a weight: what its input meets first."""
    return next((m for m in model.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)), None)


def _image_size(model: nn.Module, conv: nn.Module) -> int:
    for attr in ("image_size", "img_size"):
        size = getattr(model, attr, None)
        size = size[0] if isinstance(size, list | tuple) else size
        if isinstance(size, int) and size > 0:
            return size
    return max(4 * conv.kernel_size[0], 16)


def _from_signature(model: nn.Module, gen: torch.Generator) -> tuple[Inputs | None, str]:
    """An input for the first parameter of ``forward``, by the module it meets first."""
    name = type(model).__name__
    fix = "pass ShardConfig(example_inputs=...) (a tensor, args, kwargs, or a callable returning them)"
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None, f"{name}.forward has no signature to read; {fix}"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional:
        return None, f"{name}.forward takes no positional input; {fix}"
    first = positional[0]
    rest = [
        p for p in params if p is not first and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if rest:
        needed = ", ".join(p.name for p in rest)
        return None, f"{name}.forward needs {needed} beside {first.name}, which shardcore cannot make up; {fix}"
    module = _first_weighted(model)
    device = device_of(model)
    dtype = _dtype(model)
    source = f"{name}.forward's {first.name}"
    if isinstance(module, nn.Embedding):
        return Inputs((_ids(module.num_embeddings, gen, device),), {}, f"{source}: token ids"), ""
    if isinstance(module, nn.Conv2d | nn.Conv1d | nn.Conv3d):
        dims = len(module.kernel_size)
        size = _image_size(model, module)
        shape = (2, module.in_channels, *([size] * dims))
        return Inputs((_random(shape, gen, device, dtype),), {}, f"{source}: an input of {shape[1:]}"), ""
    if isinstance(module, nn.Linear):
        shape = (2, 8, module.in_features)
        return Inputs(
            (_random(shape, gen, device, dtype),), {}, f"{source}: features of width {module.in_features}"
        ), ""
    kind = type(module).__name__ if module is not None else "no weighted module"
    return (
        None,
        f"{name}.forward's {first.name} meets a {kind} first (not an embedding, a convolution or a linear); {fix}",
    )
