"""A rank killed (SIGKILL, on real gloo ranks) in the middle of a save: the directory still holds
the earlier checkpoint, which loads exactly, or is refused by name — never the new weights mixed
with the old. ``save_checkpoint`` (HuggingFace format, several shard files) killed between two
shards, after every shard but before the new files replace the old, and halfway through that
replacement; ``save_distributed`` (``torch.distributed.checkpoint``) killed inside DCP's save on a
non-writing rank and between the two renames that swap the new checkpoint in."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest
import torch
from toy_models import ToyLM, ToyPolicy

import shardcore
from shardcore import CheckpointError, ShardConfig
from shardcore.distributed import RankError, RankPool
from shardcore.testing import run_on_ranks

SHARDS = "40KB"  # ToyLM in about five shard files
#: fresh rank pools whose groups end broken (about 7 s each): nox -s tests-slow (CI: one part in its turn, .ci/run)
pytestmark = pytest.mark.slow


def _unsharded(seed: int) -> dict:
    torch.manual_seed(seed)
    return {n: p.detach().clone() for n, p in ToyLM().named_parameters()}


def _sharded() -> ToyLM:
    torch.manual_seed(0)
    return shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=2), policy=ToyPolicy)


def _die_on(cls, method: str, after: int) -> None:
    """SIGKILL this process at the ``after``-th call of ``cls.method`` (a crash: nothing runs after it)."""
    real, calls = getattr(cls, method), {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == after:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(cls, method, dying)


class _Os:
    """``os``, with attributes of its own that win (one module's view of it, patched alone)."""

    def __getattr__(self, name):
        return getattr(os, name)

    def rename(self, src, dst):
        return os.rename(src, dst)


def _save_then_crash(path: str, kind: str, where: str) -> None:
    """Save the seed-0 weights, change every weight, save again with this rank killed at ``where``."""
    import torch.distributed as dist

    from shardcore.checkpoint import atomic, hf_save

    model = _sharded()
    save = shardcore.save_checkpoint if kind == "hf" else shardcore.save_distributed
    save(model, path, **({"max_shard_size": SHARDS} if kind == "hf" else {}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    if dist.get_rank() == (1 if where == "inside-dcp" else 0):  # rank 0 writes the files; rank 1 a DCP part
        if where == "between-shards":
            _die_on(hf_save.StreamingSafetensors, "close", 2)  # the second shard file written
        elif where == "before-the-swap":
            _die_on(hf_save, "_replace", 1)  # every shard written, none moved in
        elif where == "inside-the-swap":
            _die_on(pathlib.Path, "unlink", 1)  # the first of the earlier checkpoint's files removed
        elif where == "inside-dcp":
            import torch.distributed.checkpoint as dcp

            _die_on(dcp.FileSystemWriter, "write_data", 1)  # before this rank's part is written
        elif where == "between-the-renames":
            renames = _Os()  # atomic.finish's own os: the earlier checkpoint moved aside, the new not in
            _die_on(renames, "rename", 2)
            atomic.os = renames
    save(model, path, **({"max_shard_size": SHARDS} if kind == "hf" else {}))


def _killed_save(path: pathlib.Path, kind: str, where: str) -> str:
    pool = RankPool(2, timeout_s=20, error_grace=5)
    try:
        with pytest.raises(RankError) as err:
            pool.run(_save_then_crash, str(path), kind, where)
    finally:
        pool.close(force=True)
    return str(err.value)


def _loaded_hf(path: pathlib.Path) -> dict:
    with torch.device("meta"):
        model = ToyLM()
    shardcore.load_checkpoint(model, path)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("where", ["between-shards", "before-the-swap"])
def test_a_writer_killed_mid_save_leaves_the_earlier_checkpoint(tmp_path, where):
    died = _killed_save(tmp_path, "hf", where)
    assert "SIGKILL" in died, died
    assert _same(_loaded_hf(tmp_path), _unsharded(0)), f"killed {where}: the earlier checkpoint did not load exactly"


def test_a_writer_killed_while_replacing_the_files_is_refused_by_name(tmp_path):
    died = _killed_save(tmp_path, "hf", "inside-the-swap")
    assert "SIGKILL" in died, died
    with pytest.raises(CheckpointError, match="interrupted while it replaced the checkpoint there"):
        _loaded_hf(tmp_path)


def _load_dcp(path: str) -> dict:
    model = _sharded()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    shardcore.load_distributed(model, path)
    return {n: t.clone() for n, t in shardcore.full_named_tensors(model)}


def test_a_rank_killed_inside_a_dcp_save_leaves_the_earlier_checkpoint(tmp_path):
    path = tmp_path / "dcp"
    died = _killed_save(path, "dcp", "inside-dcp")
    assert "SIGKILL" in died, died
    for loaded in run_on_ranks(2, _load_dcp, str(path)):
        assert _same({n: loaded[n] for n in _unsharded(0)}, _unsharded(0)), "the earlier DCP checkpoint changed"


def test_a_writer_killed_between_the_renames_is_refused_naming_the_earlier_checkpoint(tmp_path):
    path = tmp_path / "dcp"
    died = _killed_save(path, "dcp", "between-the-renames")
    assert "SIGKILL" in died, died
    with pytest.raises(CheckpointError, match=r"the previous one is intact at .*shardcore-replaced"):
        shardcore.load_distributed(ToyLM(), path)
