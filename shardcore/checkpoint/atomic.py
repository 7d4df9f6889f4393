"""A checkpoint directory that exists only once complete: every rank writes into a hidden sibling
(:func:`staging_dir`), the first rank records the files written and their sizes (:data:`RECORD`,
last) and swaps the sibling in for the directory, so an earlier checkpoint there is replaced whole,
never mixed with the new one's files. A save killed at any point leaves either the earlier
checkpoint or the new one at ``path``; :func:`check` refuses anything else by name (the record
missing or contradicted, the directory gone mid-swap)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

from .safetensors_io import CheckpointError, changed_files

__all__ = ["RECORD", "check", "check_recorded", "finish", "prepare", "record", "staging_dir"]

#: written last into a complete checkpoint: ``{"complete": true, "files": {name: bytes}}``
RECORD = "shardcore_complete.json"


def staging_dir(path: pathlib.Path) -> pathlib.Path:
    """Where a save into ``path`` is written before it becomes ``path``."""
    return path.parent / f".{path.name}.shardcore-saving"


def _replaced_dir(path: pathlib.Path) -> pathlib.Path:
    return path.parent / f".{path.name}.shardcore-replaced"


def prepare(path: pathlib.Path) -> pathlib.Path:
    """The first rank, before any rank writes: a fresh staging directory (an interrupted save's removed)."""
    staging = staging_dir(path)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def record(directory: pathlib.Path) -> None:
    """Write :data:`RECORD` into ``directory``, last: every file in it and its size."""
    skip = (RECORD, RECORD + ".tmp")
    files = {
        f.relative_to(directory).as_posix(): f.stat().st_size
        for f in sorted(directory.rglob("*"))
        if f.is_file() and f.name not in skip
    }
    tmp = directory / skip[1]
    tmp.write_text(json.dumps({"complete": True, "files": files}, indent=1))
    os.replace(tmp, directory / RECORD)


def finish(path: pathlib.Path, staging: pathlib.Path) -> None:
    """The first rank, once every rank's files are in ``staging``: record them, then swap ``staging``
    in for ``path`` (two renames; the earlier checkpoint is deleted only after the new one is in place)."""
    record(staging)
    old = _replaced_dir(path)
    if old.exists():
        shutil.rmtree(old)
    if path.exists():
        os.rename(path, old)
    os.rename(staging, path)
    shutil.rmtree(old, ignore_errors=True)


def check(path: pathlib.Path, what: str = "distributed checkpoint") -> None:
    """Refuse a ``path`` a save left incomplete, or whose files changed since it was recorded, naming
    what is wrong and what to do. A directory without the record (written by another tool, or by an
    earlier shardcore) is read as it is, if it holds what ``what`` needs."""
    if not path.exists():
        old, staging = _replaced_dir(path), staging_dir(path)
        if old.exists():
            raise CheckpointError(
                f"{what} {path}: a save was interrupted while it replaced the checkpoint there; the previous one "
                f"is intact at {old}: move it back to {path}, or save again"
            )
        hint = (
            f" (an interrupted save's files are at {staging}: it never completed; save again)"
            if staging.exists()
            else ""
        )
        raise CheckpointError(f"{what} {path} does not exist{hint}")
    if not (path / RECORD).is_file():
        if not (path / ".metadata").is_file():
            raise CheckpointError(
                f"{what} {path} has neither {RECORD} nor .metadata: not a complete distributed checkpoint "
                "(a save interrupted before its end writes neither); save it again"
            )
        return
    check_recorded(path, what)


def check_recorded(path: pathlib.Path, what: str) -> None:
    """Refuse ``path`` unless its :data:`RECORD` is there and its files are those recorded."""
    record = path / RECORD
    if not record.is_file():
        raise CheckpointError(
            f"{what} {path} was never completed ({RECORD}, written last, is missing): the save was interrupted; "
            "resume from an earlier checkpoint"
        )
    try:
        files = json.loads(record.read_text())["files"]
    except (ValueError, KeyError) as exc:
        raise CheckpointError(
            f"{record} is not a shardcore checkpoint record ({exc}); save the checkpoint again"
        ) from None
    wrong = changed_files(path, files)
    if wrong:
        raise CheckpointError(
            f"{what} {path}: its files changed since the save recorded them ({', '.join(wrong)}): another writer "
            f"mixed its files with these; save the checkpoint again (or delete {RECORD} to read what is there)"
        )
