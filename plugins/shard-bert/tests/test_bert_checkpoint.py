"""BERT built on the meta device and loaded from checkpoints: a tiny one, and the real MiniLM."""

from __future__ import annotations

import pytest
import torch
from bert_cases import batch_for, build
from test_bert_minilm import SENTENCES, mean_pooled, minilm_dir

from shardcore import ShardConfig
from shardcore.testing import assert_lazy_load_matches, assert_same_checkpoint, run_on_ranks


def _lazy(tp: int, ckpt: str, out: str) -> float:
    batch = batch_for("BertForMaskedLM")
    return assert_lazy_load_matches(
        lambda: build("BertForMaskedLM"), batch, ckpt, ShardConfig(tensor_parallel_size=tp), save_to=out
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_meta_load_then_save_round_trip(tp, tmp_path):
    torch.manual_seed(0)
    build("BertForMaskedLM").save_pretrained(tmp_path / "ckpt")
    run_on_ranks(tp, _lazy, tp, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"))


def _minilm_lazy(tp: int, path: str) -> float:
    from transformers import AutoConfig, AutoTokenizer, BertModel

    import shardcore

    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    reference = BertModel.from_pretrained(path).eval()
    with shardcore.init_empty():  # weights on meta; position ids computed as the model does
        model = BertModel(AutoConfig.from_pretrained(path))
    model = shardcore.optimize(model.eval(), ShardConfig(tensor_parallel_size=tp))
    shardcore.load_checkpoint(model, path)  # the real safetensors file, each rank reading its rows
    with torch.no_grad():
        diff = (mean_pooled(model, batch) - mean_pooled(reference, batch)).abs().max().item()
    assert diff <= 1e-5, diff
    return diff


@pytest.mark.parametrize("tp", [2, 4])
def test_minilm_checkpoint_loads_sharded(tp):
    assert max(run_on_ranks(tp, _minilm_lazy, tp, minilm_dir())) <= 1e-5
