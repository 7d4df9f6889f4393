"""save_checkpoint into a directory that already holds a checkpoint: the new one wholly replaces it
(no stale index or shard is read), a save that dies before it is complete leaves the earlier
checkpoint as it was, one that dies while replacing it is refused by name, and files changed
behind the record are refused by name."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from toy_models import ToyLM

import shardcore
from shardcore import CheckpointError
from shardcore.checkpoint import hf_save


def _model(seed: int) -> ToyLM:
    torch.manual_seed(seed)
    return ToyLM()


def _loaded(path) -> dict:
    with torch.device("meta"):
        model = ToyLM()
    shardcore.load_checkpoint(model, path)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(model: ToyLM, loaded: dict) -> bool:
    return all(torch.equal(p, loaded[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize(
    ("first", "second"), [("40KB", "5GB"), ("5GB", "40KB")], ids=["many-then-one", "one-then-many"]
)
def test_a_save_over_an_earlier_checkpoint_replaces_it_wholly(tmp_path, first, second):
    """Epoch 1 saved as several files, epoch 2 as one (and the reverse) into the same directory:
    the load returns epoch 2's weights (before, the stale index was read first: epoch 1's)."""
    old, new = _model(0), _model(1)
    shardcore.save_checkpoint(old, tmp_path, max_shard_size=first)
    shardcore.save_checkpoint(new, tmp_path, max_shard_size=second)
    assert _same(new, _loaded(tmp_path)), "the load returned the earlier checkpoint's weights, not the new ones"
    record = json.loads((tmp_path / "shardcore_checkpoint.json").read_text())
    on_disk = {f.name for f in tmp_path.iterdir()} - {"shardcore_checkpoint.json", "config.json"}
    assert record["complete"] and set(record["files"]) == on_disk  # nothing of epoch 1 left
    assert not (tmp_path / ".shardcore-saving").exists()


def test_a_save_that_dies_before_it_is_complete_leaves_the_earlier_checkpoint(tmp_path, monkeypatch):
    """A crash while the shards are written (here: the third tensor raises): the directory's
    earlier checkpoint loads exactly; the next save clears the half-written staging directory."""
    old = _model(0)
    shardcore.save_checkpoint(old, tmp_path, max_shard_size="40KB")
    calls = {"n": 0}
    real = hf_save.StreamingSafetensors.write

    def dies(self, tensor):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        real(self, tensor)

    monkeypatch.setattr(hf_save.StreamingSafetensors, "write", dies)
    with pytest.raises(OSError, match="disk full"):
        shardcore.save_checkpoint(_model(1), tmp_path, max_shard_size="40KB")
    monkeypatch.undo()
    assert (tmp_path / ".shardcore-saving").exists() and _same(old, _loaded(tmp_path))
    new = _model(2)
    shardcore.save_checkpoint(new, tmp_path)
    assert _same(new, _loaded(tmp_path)) and not (tmp_path / ".shardcore-saving").exists()


def test_a_save_that_dies_while_replacing_is_refused_by_name(tmp_path, monkeypatch):
    """A crash after the earlier files were removed and before every new one is in place: the
    record says incomplete, and the reader refuses the mix instead of loading it."""
    shardcore.save_checkpoint(_model(0), tmp_path, max_shard_size="40KB")
    real, moved = hf_save.os.replace, []

    def dies(src, dst):
        if Path(src).parent.name == ".shardcore-saving" != Path(dst).parent.name:  # staged -> the directory
            moved.append(dst)
            if len(moved) == 2:
                raise OSError("killed")
        real(src, dst)

    monkeypatch.setattr(hf_save.os, "replace", dies)
    with pytest.raises(OSError, match="killed"):
        shardcore.save_checkpoint(_model(1), tmp_path, max_shard_size="40KB")
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="a save_checkpoint into it was interrupted while it replaced"):
        _loaded(tmp_path)


def test_files_changed_behind_the_record_are_refused_by_name(tmp_path):
    """Another writer's file in place of one save_checkpoint wrote: refused, naming the file."""
    shardcore.save_checkpoint(_model(0), tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match=f"{shard.name} \\(\\d+ bytes, not \\d+\\)"):
        _loaded(tmp_path)


def test_resume_passes_over_an_interrupted_checkpoint_and_refuses_one_named(tmp_path):
    """A checkpoint a crash interrupted has no record: ``resume_from_checkpoint=True`` takes the
    newest recorded one and names the one it passed over; the interrupted one named is refused."""
    from shardcore.checkpoint import atomic
    from shardcore.integrations.hf.trainer import _newest_complete

    for step in (2, 4, 6):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"x" * step)
    atomic.record(tmp_path / "checkpoint-2")
    atomic.record(tmp_path / "checkpoint-4")
    (tmp_path / "checkpoint-4" / "model.safetensors").write_bytes(b"y")  # changed behind the record
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = _newest_complete(tmp_path)
    assert chosen == str(tmp_path / "checkpoint-2"), f"resumed from {chosen}, not the newest complete checkpoint-2"
    said = [str(w.message) for w in caught]
    assert any("checkpoint-6 was never completed" in m and "checkpoint-4: its files" in m for m in said), said
    with pytest.raises(CheckpointError, match="checkpoint-6 was never completed"):
        atomic.check_recorded(tmp_path / "checkpoint-6", "shardcore.hf.Trainer checkpoint")
    with pytest.raises(ValueError, match="No complete checkpoint"):
        _newest_complete(tmp_path / "checkpoint-6")
