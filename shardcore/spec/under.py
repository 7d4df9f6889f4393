"""Names of a composite's part, seen from the whole model."""

from __future__ import annotations


def under(path: str, name: str) -> str:
    """``name`` (relative to the part at ``path``) as the whole model names it."""
    return f"{path}.{name}" if name and path else (path or name)


def inside(path: str, name: str) -> str | None:
    """``name`` (the whole model's) relative to the part at ``path``; ``None`` when it is not in the part."""
    if not path:
        return name
    return name[len(path) + 1 :] if name.startswith(f"{path}.") else None
