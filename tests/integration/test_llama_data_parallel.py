"""Llama under data parallelism on the mesh's dp dim (FSDP2 per block, or DDP) composed with TP,
on 4 gloo ranks: training equals the unsharded model on the whole batch; checkpoints across layouts."""

from __future__ import annotations

import pytest
import torch
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


def _train_check(dp: int, tp: int, mode: str, extra: dict | None = None) -> dict:
    config = ShardConfig(tensor_parallel_size=tp, data_parallel_size=dp, data_parallel=mode, **(extra or {}))
    report = assert_data_parallel_matches(lambda: build("LlamaForCausalLM", **CFG), _batch(), config)
    return report


@pytest.mark.parametrize(
    ("dp", "tp", "mode", "fraction", "extra"),
    [
        (2, 2, "fsdp", 1 / 4, {}),  # the acceptance layout: every byte split over dp x tp
        (4, 1, "fsdp", 1 / 4, {}),
        (2, 2, "ddp", 1 / 2, {}),  # DDP keeps whole TP slices on each replica
        (2, 2, "zero2", 1 / 4, {}),  # ZeRO-2: split like FSDP between steps, whole from forward to backward
        (4, 1, "hsdp", 1 / 2, {"data_parallel_shard_size": 2}),  # split over 2, replicated over the other 2
    ],
    ids=[
        "fsdp2xtp2",
        "fsdp4",
        "ddp2xtp2",
        "zero2xtp2",
        "hsdp2x2",
    ],  # HSDP 2x2 x TP=2: test_llama_pipeline_data_parallel
)
def test_trains_like_unsharded_full_batch(dp, tp, mode, fraction, extra):
    reports = run_on_ranks(dp * tp, _train_check, dp, tp, mode, extra)
    for report in reports:
        assert report["data_parallel"] == mode and (report["dp"], report["tp"]) == (dp, tp)
        assert "max_abs_diff_after_steps" in report
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

    torch.manual_seed(0)
    build("LlamaForCausalLM", **CFG).save_pretrained(tmp_path / "ref")
    run_on_ranks(4, _hf_round_trip, str(tmp_path / "ref"), str(tmp_path / "out"))
    assert_same_checkpoint(str(tmp_path / "ref"), str(tmp_path / "out"))
    import json

    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def _mixed(mode: str, dtype: str) -> dict:
    """FSDP2's mixed precision (``ShardConfig(mixed_precision=...)``) x TP against the unsharded model under
    ``torch.autocast`` on the whole batch: loss, every gradient and 3 AdamW steps, master weights fp32."""
    import torch.distributed as dist

    import shardcore
    from shardcore.testing import dp_part

    config = ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel=mode, mixed_precision=dtype)
    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", **CFG)
    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", **CFG), config)
    layout = model.shardcore.layout
    mine = dp_part(_batch(), layout.coordinates(dist.get_rank())["dp"], layout.dp)
    init = {n: p.detach().clone() for n, p in ref.named_parameters()}
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-5) for m in (ref, model)]
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    out: dict = {"loss": [], "grad": 0.0}
    for step in range(3):
        with torch.autocast("cpu", dtype=low):
            loss_ref = ref(**_batch()).loss
        loss_ref.backward()
        out_sharded = model(**mine)
        out["logits"] = str(out_sharded.logits.dtype)  # FSDP's mixed precision leaves the output in bf16
        loss = out_sharded.loss
        loss.backward()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean, group=layout.group("dp"))
        out["loss"].append(abs(mean.item() / 2 - loss_ref.item()) / loss_ref.item())
        if step == 0:
            ref_grads = {n: p.grad for n, p in ref.named_parameters()}
            for name, grad in shardcore.full_named_tensors(model, grads=True):
                rel = (grad - ref_grads[name]).norm() / ref_grads[name].norm().clamp_min(1e-6)
                out["grad"] = max(out["grad"], rel.item())
        for opt in opts:
            opt.step()
            opt.zero_grad()
    expected = dict(ref.named_parameters())
    out["dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    apart = moved = 0.0  # how far the runs' weights ended apart, against how far the unsharded run moved them
    for name, full in shardcore.full_named_tensors(model):
        apart += (full - expected[name]).double().pow(2).sum().item()
        moved += (expected[name] - init[name]).double().pow(2).sum().item()
    out["step"] = (apart / moved) ** 0.5
    return out


def test_bf16_mixed_precision_fsdp_x_tp_within_bf16_of_the_unsharded_autocast_run():
    for r in run_on_ranks(4, _mixed, "fsdp", "bf16"):
        # bf16 keeps 8 bits of mantissa (relative 2**-8 = 0.4%): FSDP computes every op in bf16, autocast
        # only the matmuls, so the two runs differ at that level, not more
        assert r["dtypes"] == ["torch.float32"], r  # the master weights (and so AdamW's state) stay fp32
        assert r["logits"] == "torch.bfloat16", f"the sharded model computed in {r['logits']}, not bf16"
        # measured: loss within 1e-4 relative, gradients 1.4%, the weights after 3 steps 2.0% of the update apart
        assert max(r["loss"]) <= 1e-3 and r["grad"] <= 5e-2 and r["step"] <= 5e-2, r


def _uneven_batch() -> dict:
    """4 rows; rows 0 and 1 (the first data-parallel part) padded, 7 and 2 tokens: the parts hold
    uneven numbers of label tokens, so the mean of the parts' mean losses is not the batch's."""
    batch = lm_batch(1001, batch=4, seed=5, pad=False)
    for row, pad in ((0, 7), (1, 2)):
        batch["attention_mask"][row, :pad] = 0
        batch["input_ids"][row, :pad] = 0
        batch["labels"][row, :pad] = -100
    return batch


def _token_weighted(mode: str, dp: int, tp: int) -> dict:
    """The user's loop for a token-weighted loss under data parallelism: each rank's loss is its
    tokens' summed loss over the whole batch's count (``num_items_in_batch``), times dp (the
    data-parallel reduction averages the gradients over dp); one SGD step, against the unsharded
    model on the whole batch, and the plain per-rank mean (which must differ: the test can fail)."""
    import torch.distributed as dist

    import shardcore
    from shardcore.testing.data_parallel import dp_part

    batch = _uneven_batch()
    count = batch["labels"][:, 1:].ne(-100).sum()  # the label tokens a causal LM's loss averages over
    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", **CFG)
    ref_loss = ref(**batch).loss
    assert torch.allclose(ref(**batch, num_items_in_batch=count).loss, ref_loss), "count is not HF's own"
    ref_loss.backward()
    report = {}
    for name, weighted in (("token-weighted", True), ("per-rank mean", False)):
        torch.manual_seed(0)
        config = ShardConfig(tensor_parallel_size=tp, data_parallel_size=dp, data_parallel=mode)
        model = shardcore.optimize(build("LlamaForCausalLM", **CFG), config)
        part = dp_part(batch, model.shardcore.layout.coordinates(dist.get_rank())["dp"], dp)
        loss = model(**part, num_items_in_batch=count).loss * dp if weighted else model(**part).loss
        loss.backward()
        worst = 0.0
        for n, grad in shardcore.full_named_tensors(model, grads=True):
            want = dict(ref.named_parameters())[n].grad
            worst = max(worst, ((grad - want).norm() / want.norm()).item())
        report[name] = worst
    return report


@pytest.mark.parametrize(("mode", "dp", "tp"), [("ddp", 2, 2), ("fsdp", 2, 2), ("ddp", 2, 1)])
def test_uneven_label_counts_train_like_the_whole_batch_with_the_token_weighted_loss(mode, dp, tp):
    for report in run_on_ranks(dp * tp, _token_weighted, mode, dp, tp):
        assert report["token-weighted"] < 1e-5, f"token-weighted loss under {mode}: gradients off by {report}"
        assert report["per-rank mean"] > 1e-2, f"the parts' label counts are not uneven enough to tell: {report}"
