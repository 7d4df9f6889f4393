"""Llama in 3-D layouts: pipeline stages x data parallelism (FSDP2, ZeRO-2, DDP) x TP, and HSDP x TP, on gloo
ranks: pipeline_step trains like the unsharded model on the whole batch (loss, every gradient, 3 AdamW steps),
through clipping, a distributed checkpoint resumed at another layout, and a HuggingFace checkpoint round trip."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, lm_batch

import shardcore
from shardcore import ShardConfig
from shardcore.testing import (
    assert_clipping_matches,
    assert_data_parallel_matches,
    assert_lazy_load_matches,
    assert_pipeline_matches,
    assert_resume_matches,
    assert_same_checkpoint,
    run_on_ranks,
    train_and_save,
)

CFG = {"kv": 2, "tie": True, "layers": 4}  # GQA; the tied embedding on the first and the last stage


def _batch(seed: int = 1) -> dict:
    # 4 rows, no padding: each data-parallel part holds the same number of label tokens
    return lm_batch(batch=4, seed=seed, pad=False)


def _config(pp: int, dp: int, tp: int, mode: str, schedule: str = "1F1B", **extra) -> ShardConfig:
    return ShardConfig(
        pipeline_parallel_size=pp,
        data_parallel_size=dp,
        tensor_parallel_size=tp,
        data_parallel=mode,
        num_microbatches=2,
        pipeline_schedule=schedule,
        **extra,
    )


def _check(pp: int, dp: int, tp: int, mode: str, schedule: str) -> dict:
    config = _config(pp, dp, tp, mode, schedule)
    return assert_pipeline_matches(lambda: build("LlamaForCausalLM", **CFG), _batch(), config)


@pytest.mark.parametrize(
    ("mode", "schedule"),
    [("fsdp", "1F1B"), ("ddp", "Interleaved1F1B"), ("zero2", "GPipe"), ("fsdp", "LoopedBFS")],
    ids=["fsdp-1f1b", "ddp-interleaved", "zero2-gpipe", "fsdp-loopedbfs"],
)
def test_pp2_x_dp2_trains_like_unsharded(mode, schedule):
    reports = run_on_ranks(4, _check, 2, 2, 1, mode, schedule)
    for r in reports:
        assert r["data_parallel"] == mode and r["loss_rel_diff"] <= 1e-6, r
        assert r["max_rel_err_grads"] <= 1e-5 and "max_abs_diff_after_steps" in r, r
    # mesh (dp, pp, sp, tp): ranks 0, 2 run the first stage(s), 1, 3 the last, on two data-parallel parts
    firsts = [r["stages"][0] for r in reports]
    assert firsts == [0, 1, 0, 1], firsts


def _clip(config: dict) -> dict:
    return assert_clipping_matches(lambda: build("LlamaForCausalLM", **CFG), _batch(), ShardConfig(**config))


@pytest.mark.parametrize(
    "config",
    [
        {"pipeline_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp", "num_microbatches": 2},
        {
            "tensor_parallel_size": 1,
            "data_parallel": "hsdp",
            "data_parallel_shard_size": 2,
        },  # summed over the shard pair
    ],
    ids=["pp2xfsdp2", "hsdp2x2"],
)
def test_clipping_across_stages_and_data_parallel_shards(config):
    for r in run_on_ranks(4, _clip, config):
        assert r["norm_rel_diff"] <= 1e-5 and "max_abs_diff_after_step" in r, r


def _save(path: str) -> None:
    batches = [_batch(), _batch(2)]
    train_and_save(lambda: build("LlamaForCausalLM", **CFG), batches, _config(2, 2, 1, "fsdp"), path)


def _resume(path: str, config: dict) -> float:
    saved, rest = [_batch(), _batch(2)], [_batch(3)]
    return assert_resume_matches(lambda: build("LlamaForCausalLM", **CFG), saved, rest, ShardConfig(**config), path)


def test_distributed_checkpoint_of_pp2_x_fsdp2_resumes_at_another_layout(tmp_path):
    run_on_ranks(4, _save, str(tmp_path / "dcp"))
    assert max(run_on_ranks(2, _resume, str(tmp_path / "dcp"), {"tensor_parallel_size": 2})) <= 1e-5
    ddp = {"pipeline_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "ddp", "num_microbatches": 2}
    assert max(run_on_ranks(4, _resume, str(tmp_path / "dcp"), ddp)) <= 1e-5


def _hf_round_trip(ckpt: str, out: str) -> float:
    return assert_lazy_load_matches(
        lambda: build("LlamaForCausalLM", **CFG), _batch(), ckpt, _config(2, 2, 1, "fsdp"), save_to=out
    )


def test_hf_checkpoint_loads_and_saves_under_pp2_x_fsdp2(tmp_path):
    torch.manual_seed(0)
    build("LlamaForCausalLM", **CFG).save_pretrained(tmp_path / "ref")
    assert max(run_on_ranks(4, _hf_round_trip, str(tmp_path / "ref"), str(tmp_path / "out"))) <= 1e-5
    assert_same_checkpoint(str(tmp_path / "ref"), str(tmp_path / "out"))


# -- 8 ranks: the full 3-D layouts (one pool, closed at the end) -------------------------------------------


def _pp_fsdp_tp() -> dict:
    return assert_pipeline_matches(lambda: build("LlamaForCausalLM", **CFG), _batch(), _config(2, 2, 2, "fsdp"))


def _hsdp_tp() -> dict:
    config = ShardConfig(tensor_parallel_size=2, data_parallel="hsdp", data_parallel_shard_size=2)
    return assert_data_parallel_matches(lambda: build("LlamaForCausalLM", **CFG), _batch(), config)


@pytest.fixture(scope="module")
def eight_ranks():
    yield
    from shardcore.testing import close_pools

    close_pools(8)  # 8 idle processes would hold ~8 GB for the rest of the suite


@pytest.mark.slow  # 8 processes: nox -s tests-slow
def test_pp2_x_fsdp2_x_tp2_on_8_ranks(eight_ranks):
    for r in run_on_ranks(8, _pp_fsdp_tp):
        assert r["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in r, r


@pytest.mark.slow  # 8 processes: nox -s tests-slow
def test_hsdp_2x2_x_tp2_on_8_ranks(eight_ranks):
    reports = run_on_ranks(8, _hsdp_tp)
    for r in reports:  # split over the 2 ranks of a shard group and over TP; replicated over the other pair
        assert (r["dp"], r["tp"], r["data_parallel"]) == (4, 2, "hsdp") and "max_abs_diff_after_steps" in r, r
        assert abs(r["state_fraction"] - 1 / 4) <= 0.03 / 4, r


def test_the_loss_scale_argument_scales_the_backward_and_returns_the_loss():
    model = build("LlamaForCausalLM", **CFG)
    twin = build("LlamaForCausalLM", **CFG)
    twin.load_state_dict(model.state_dict())
    loss = shardcore.pipeline_step(model, _batch(), loss_scale=lambda x: x * 8)
    twin(**_batch()).loss.backward()
    assert torch.equal(loss, twin(**_batch()).loss.detach())
    for (n, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad * 8, msg=n)
