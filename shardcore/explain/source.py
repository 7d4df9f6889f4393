"""What a model given by name on the command line is: a directory with a HuggingFace ``config.json``
(its class from ``architectures``), or ``module:Class`` / ``module:function`` (a HuggingFace class
with its default config, anything else called without arguments). ``shardcore explain`` builds it on
the meta device, ``shardcore check`` with weights on every rank."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__all__ = ["from_directory", "model_source"]


def from_directory(spec: Any) -> bool:
    """Whether ``spec`` names a directory with a config (or the ``config.json`` itself)."""
    path = Path(str(spec))
    return path.is_dir() or (path.suffix == ".json" and path.is_file())


def model_source(spec: Any, who: str) -> tuple[Any, Any]:
    """``(config, target)``: the HuggingFace config and class a directory names, or ``module:attr``'s
    target with its class's default config (``None`` for a target that is no HuggingFace class: call it).
    ``who`` starts each error's message."""
    if from_directory(spec):
        import transformers

        from ..inference import read_config

        path = Path(str(spec))
        config, arch = read_config(path if path.is_dir() else path.parent, who=who)
        cls = getattr(transformers, arch, None)
        if cls is None:
            raise ValueError(
                f"{who}: config.json names the architecture {arch!r}, which transformers "
                f"{transformers.__version__} does not have"
            )
        return config, cls
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not attr:
        raise ValueError(
            f"{who}: {str(spec)!r} is neither a directory with a config.json nor 'module:Class' "
            "(e.g. transformers:LlamaForCausalLM)"
        )
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{who}: cannot import {spec!r}: {err}") from err
    config_class = getattr(target, "config_class", None)
    return (config_class() if config_class is not None else None), target
