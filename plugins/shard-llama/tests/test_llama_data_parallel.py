"""Llama under data parallelism on the mesh's dp dim (FSDP2 per block, or DDP) composed with TP,
on 4 gloo ranks: training equals the unsharded model on the whole batch; checkpoints across layouts."""

from __future__ import annotations

import pytest
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import (
    assert_data_parallel_matches,
    assert_lazy_load_matches,
    assert_resume_matches,
    assert_same_checkpoint,
    run_on_ranks,
    train_and_save,
)

CFG = {"kv": 2, "tie": True, "vocab": 1001}  # grouped-query attention, tied and padded vocab


def _batch(seed: int = 1) -> dict:
    # 4 rows, no padding: every data-parallel part holds the same number of label tokens, so the
    # mean of the parts' mean losses is the whole batch's mean loss
    return lm_batch(1001, batch=4, seed=seed, pad=False)


def _train_check(dp: int, tp: int, mode: str) -> dict:
    return assert_data_parallel_matches(
        lambda: build("LlamaForCausalLM", **CFG),
        _batch(),
        ShardConfig(tensor_parallel_size=tp, data_parallel_size=dp, data_parallel=mode),
    )


@pytest.mark.parametrize(
    ("dp", "tp", "mode", "fraction"),
    [
        (2, 2, "fsdp", 1 / 4),  # the acceptance layout: every byte split over dp x tp
        (4, 1, "fsdp", 1 / 4),
        (2, 2, "ddp", 1 / 2),  # DDP keeps whole TP slices on each replica
    ],
    ids=["fsdp2xtp2", "fsdp4", "ddp2xtp2"],
)
def test_trains_like_unsharded_full_batch(dp, tp, mode, fraction):
    reports = run_on_ranks(4, _train_check, dp, tp, mode)
    for report in reports:
        assert report["data_parallel"] == mode and (report["dp"], report["tp"]) == (dp, tp)
        assert report["max_abs_diff_after_steps"] <= 1e-5
        # parameters + AdamW state per rank, within 3% of 1/(dp*tp) (1/tp for DDP): the norms are
        # replicated over TP, the vocab is padded for TP, FSDP's last shard of a row count not
        # divisible by dp is shorter
        assert abs(report["state_fraction"] - fraction) <= 0.03 * fraction, report
    print(
        f"\n{mode} dp={dp} tp={tp}: parameter + optimizer bytes per rank {reports[0]['state_fraction']:.4f} of unsharded"
    )


def _save(path: str) -> None:
    config = ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="fsdp")
    train_and_save(lambda: build("LlamaForCausalLM", **CFG), [_batch(s) for s in range(2)], config, path)


def _resume(path: str, dp: int, tp: int, mode: str | None) -> float:
    saved, rest = [_batch(s) for s in range(2)], [_batch(s) for s in range(2, 4)]
    config = ShardConfig(tensor_parallel_size=tp, data_parallel_size=dp, data_parallel=mode)
    return assert_resume_matches(lambda: build("LlamaForCausalLM", **CFG), saved, rest, config, path)


@pytest.mark.parametrize(
    ("dp", "tp", "mode"), [(1, 2, None), (4, 1, "fsdp"), (2, 2, "ddp")], ids=["tp2", "fsdp4", "ddp2xtp2"]
)
def test_distributed_checkpoint_resumes_at_another_layout(dp, tp, mode, tmp_path):
    run_on_ranks(4, _save, str(tmp_path / "dcp"))
    worst = run_on_ranks(dp * tp, _resume, str(tmp_path / "dcp"), dp, tp, mode)
    assert max(worst) <= 1e-5


def _hf_round_trip(ckpt: str, out: str) -> float:
    config = ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="fsdp")
    return assert_lazy_load_matches(lambda: build("LlamaForCausalLM", **CFG), lm_batch(1001), ckpt, config, save_to=out)


def test_hf_checkpoint_loads_and_saves_under_fsdp_x_tp(tmp_path):
    import torch

    torch.manual_seed(0)
    build("LlamaForCausalLM", **CFG).save_pretrained(tmp_path / "ref")
    run_on_ranks(4, _hf_round_trip, str(tmp_path / "ref"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ref"), str(tmp_path / "out"))
    import json

    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
