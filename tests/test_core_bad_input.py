"""Bad input, fuzzed: a checkpoint file truncated, with a corrupt header, a header that lies about a
tensor's shape or dtype, or a header length past the file's end; a YAML plan that is malformed or
names what the model lacks. Each is a ``CheckpointError`` / ``PlanError`` naming the file (and the
tensor or key) and what to do, raised on every rank alike before any collective: no rank hangs."""

from __future__ import annotations

import json
import pathlib
import shutil
import struct

import pytest
import torch
from toy_models import ToyLM, ToyPolicy

import shardcore
from shardcore import ShardConfig
from shardcore.plan import PlanError
from shardcore.testing import count_c10d_calls, run_on_ranks


def _rewrite_header(file: pathlib.Path, change) -> None:
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    file.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])


def _double_shape(header) -> None:
    header["embed.weight"]["shape"] = [2 * d for d in header["embed.weight"]["shape"]]


def _claim_f16(header) -> None:
    header["embed.weight"]["dtype"] = "F16"


def _truncate(file: pathlib.Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _corrupt_header(file: pathlib.Path) -> None:
    data = bytearray(file.read_bytes())
    data[8:20] = b"\xff" * 12
    file.write_bytes(bytes(data))


def _huge_header(file: pathlib.Path) -> None:
    file.write_bytes(struct.pack("<Q", 10**12) + file.read_bytes()[8:])


DAMAGE = {
    "truncated": (_truncate, "truncated (tensor"),
    "corrupt-header": (_corrupt_header, "not a readable safetensors file"),
    "header-length-past-the-end": (_huge_header, "header of 1000000000000 bytes in a file of"),
    "header-lies-about-shape": (
        lambda f: _rewrite_header(f, _double_shape),
        "its header lies about tensor 'embed.weight'",
    ),
    "header-lies-about-dtype": (
        lambda f: _rewrite_header(f, _claim_f16),
        "F16 [101, 64] is 12928 bytes, its data spans",
    ),
}


def _load_damaged(path: str) -> tuple[str, dict]:
    torch.manual_seed(0)
    model = shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=2), policy=ToyPolicy)
    with count_c10d_calls() as calls:
        try:
            shardcore.load_checkpoint(model, path)
            message = "loaded"
        except shardcore.CheckpointError as err:
            message = str(err)
    return message, dict(calls)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_by_name_on_every_rank_before_any_collective(tmp_path, damage):
    torch.manual_seed(0)
    shardcore.save_checkpoint(ToyLM(), tmp_path)
    (tmp_path / "shardcore_checkpoint.json").unlink()  # as another tool wrote it: the reader alone judges
    spoil, says = DAMAGE[damage]
    spoil(tmp_path / "model.safetensors")
    results = run_on_ranks(2, _load_damaged, str(tmp_path))
    for message, calls in results:
        assert "model.safetensors" in message and says in message, f"the {damage} checkpoint: {message}"
        assert not calls, f"refused only after {calls} calls to other ranks: {message}"
    assert results[0][0] == results[1][0]


PLANS = {
    "a tab": ("blocks.*.fc1:\n\t- tp\n", r"plan.yaml:2: malformed YAML: found character '\\t'"),
    "unclosed flow": ("blocks.*.fc1: [tp, null\n", r"plan.yaml:2: malformed YAML"),
    "a list, not a mapping": (
        "- colwise\n- rowwise\n",
        r"a sharding plan is a mapping of parameter names to specs, got list",
    ),
    "a missing parameter": (
        "blocks.0.fc1.weightx: [tp, null]\n",
        r"'blocks.0.fc1.weightx' matches no parameter or module",
    ),
    "an unknown style": ("blocks.*.fc1: sideways\n", r"'blocks.\*.fc1': a spec is a list of mesh axis names or null"),
}


@pytest.mark.parametrize("case", list(PLANS))
def test_a_bad_plan_is_refused_naming_the_file_and_line(tmp_path, case):
    text, says = PLANS[case]
    (tmp_path / "plan.yaml").write_text(text)
    with pytest.raises(PlanError, match=says):
        shardcore.optimize(ToyLM(), ShardConfig(plan=str(tmp_path / "plan.yaml")))
    shutil.rmtree(tmp_path)
