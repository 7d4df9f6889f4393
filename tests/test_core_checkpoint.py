"""Lazy (meta) initialization, load_checkpoint and save_checkpoint on a plain-torch model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from toy_models import ToyLM, ToyPolicy, toy_batch

import shardcore
from shardcore import CheckpointError, ShardConfig
from shardcore.testing import run_on_ranks


def _save_unsharded(path: Path, vocab: int = 101) -> dict:
    torch.manual_seed(0)
    model = ToyLM(vocab=vocab)
    state = {k: v.contiguous() for k, v in model.named_parameters()}  # tied head.weight once, like save_pretrained
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"))
    return state


def _load_and_compare(tp: int, ckpt: str, out: str) -> float:
    torch.manual_seed(0)
    ref = ToyLM()
    with torch.device("meta"):
        model = ToyLM()
    model = shardcore.optimize(model, ShardConfig(tensor_parallel_size=tp), policy=ToyPolicy)
    assert all(p.is_meta for p in model.parameters())
    with pytest.raises(RuntimeError, match="load_checkpoint"):
        model(**toy_batch())
    shardcore.load_checkpoint(model, ckpt)
    assert not any(p.is_meta for p in model.parameters())
    assert model.head.weight is model.embed.weight  # still tied
    with torch.no_grad():
        diff = (model(**toy_batch())["logits"] - ref(**toy_batch())["logits"]).abs().max().item()
    assert diff <= 1e-6, diff
    shardcore.save_checkpoint(model, out, max_shard_size="40KB")  # several files and an index
    return diff


@pytest.mark.parametrize("tp", [2, 4])
def test_meta_model_loads_its_slices_and_saves_back_bit_exact(tp, tmp_path):
    state = _save_unsharded(tmp_path / "ckpt")
    run_on_ranks(tp, _load_and_compare, tp, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    saved = {}
    for f in files:
        saved.update(load_file(str(tmp_path / "out" / f)))
    assert saved.keys() == state.keys()
    for k, v in state.items():
        assert torch.equal(saved[k], v), k  # full, unpadded, bit-exact


def test_single_process_meta_load(tmp_path):
    _save_unsharded(tmp_path / "ckpt")
    _load_and_compare_single(str(tmp_path / "ckpt"))


def _load_and_compare_single(ckpt: str) -> None:
    torch.manual_seed(0)
    ref = ToyLM()
    with torch.device("meta"):
        model = shardcore.optimize(ToyLM(), policy=ToyPolicy)
    shardcore.load_checkpoint(model, ckpt)
    with torch.no_grad():
        assert torch.equal(model(**toy_batch())["logits"], ref(**toy_batch())["logits"])


def _bad(tp: int, ckpt: str) -> str:
    import torch.distributed as dist

    with torch.device("meta"):
        model = ToyLM()
    model = shardcore.optimize(model, ShardConfig(tensor_parallel_size=tp), policy=ToyPolicy)
    try:
        shardcore.load_checkpoint(model, ckpt)
        message = "no error"
    except CheckpointError as exc:
        message = str(exc)
    dist.barrier()  # no rank is left hanging
    return message


def test_bad_checkpoints_fail_clearly_on_every_rank(tmp_path):
    state = _save_unsharded(tmp_path / "good")
    missing = dict(state)
    del missing["blocks.1.fc2.weight"]
    (tmp_path / "missing").mkdir()
    save_file(missing, str(tmp_path / "missing" / "model.safetensors"))
    wrong = dict(state)
    wrong["blocks.0.qkv.weight"] = torch.zeros(10, 64)
    (tmp_path / "wrong").mkdir()
    save_file(wrong, str(tmp_path / "wrong" / "model.safetensors"))
    (tmp_path / "truncated").mkdir()
    data = (tmp_path / "good" / "model.safetensors").read_bytes()
    (tmp_path / "truncated" / "model.safetensors").write_bytes(data[: len(data) - 1000])
    (tmp_path / "empty").mkdir()
    cases = {
        "missing": "missing tensor 'blocks.1.fc2.weight'",
        "wrong": "tensor 'blocks.0.qkv.weight' has shape [10, 64] in the checkpoint, the model expects [192, 64]",
        "truncated": "cannot read",
        "empty": "no model.safetensors or model.safetensors.index.json",
    }
    for case, expected in cases.items():
        messages = run_on_ranks(2, _bad, 2, str(tmp_path / case))
        assert all(expected in m for m in messages), (case, messages)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_loaded_weights_are_private_and_saving_over_the_source_is_safe(zero_copy, tmp_path):
    """Zero-copy loading maps the file copy-on-write: training never writes into the checkpoint,
    and save_checkpoint can replace the very files the model was loaded from."""
    state = _save_unsharded(tmp_path / "ckpt")
    with torch.device("meta"):
        model = ToyLM()
    shardcore.load_checkpoint(model, tmp_path / "ckpt", zero_copy=zero_copy)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    on_disk = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert all(torch.equal(on_disk[k], v) for k, v in state.items())  # the file is untouched
    shardcore.save_checkpoint(model, tmp_path / "ckpt")  # over the source, atomically
    again = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert all(torch.equal(again[k], v + 1.0) for k, v in state.items())
    assert not list((tmp_path / "ckpt").glob("*.tmp"))


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_zero_dim_parameter_is_saved_and_loaded(zero_copy, tmp_path):
    """A 0-dim parameter (a learned temperature such as a contrastive model's logit scale) goes
    through save_checkpoint and load_checkpoint like any tensor."""
    model = ToyLM()
    model.scale = torch.nn.Parameter(torch.tensor(2.6592))
    shardcore.save_checkpoint(model, tmp_path / "ckpt")
    assert load_file(str(tmp_path / "ckpt" / "model.safetensors"))["scale"].shape == ()
    with torch.device("meta"):
        again = ToyLM()
        again.scale = torch.nn.Parameter(torch.tensor(0.0))
    shardcore.load_checkpoint(again, tmp_path / "ckpt", zero_copy=zero_copy)
    assert again.scale.shape == () and again.scale.item() == pytest.approx(2.6592)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters(), strict=True))


def test_init_empty_touches_nothing_outside_its_block_and_thread():
    """Parameters move to meta inside the block, on its thread only; after it nothing is left
    (no hook, no patched nn.Module)."""
    import threading

    from torch.nn.modules import module as torch_module

    from shardcore import init_empty

    hooks_before = dict(torch_module._global_parameter_registration_hooks)
    register_before = nn.Module.register_parameter
    other = {}
    with init_empty():
        inside = nn.Linear(4, 4)
        worker = threading.Thread(target=lambda: other.setdefault("linear", nn.Linear(4, 4)))
        worker.start()
        worker.join()
    after = nn.Linear(4, 4)
    assert inside.weight.is_meta and inside.bias.is_meta
    assert not other["linear"].weight.is_meta, "init_empty moved another thread's new parameters to meta"
    assert not after.weight.is_meta
    assert dict(torch_module._global_parameter_registration_hooks) == hooks_before
    assert nn.Module.register_parameter is register_before
