"""A script's ``main`` loaded by file path, so that a test runs the very lines the docs show."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from collections.abc import Callable

__all__ = ["example_main"]


def example_main(path: str | pathlib.Path) -> Callable:
    """The ``main`` of the script at ``path`` (imported once per process, as module
    ``shardcore_example_<stem>``, so :func:`~shardcore.testing.run_on_ranks` can send it to the ranks)."""
    path = pathlib.Path(path).resolve()
    name = f"shardcore_example_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].main
