"""``shardcore.StepMetrics``: tokens/s, MFU, step time, peak memory per rank and the loss of a real
FSDP=2 x TP=2 loop, each checked against what the ranks did (each data-parallel part's tokens once,
the loss the ranks computed, 6 x the unsharded model's non-embedding parameters per token); nothing
between log steps is a collective; sinks run on rank 0 only."""

from __future__ import annotations

import torch
from toy_models import ToyLM, ToyPolicy, toy_batch

import shardcore
from shardcore import ShardConfig
from shardcore.testing import count_c10d_calls, run_on_ranks

PEAK = 1e9  # a stated peak, so MFU is reported on the CPU


def _loop() -> dict:
    import torch.distributed as dist

    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="fsdp")
    model = shardcore.optimize(ToyLM(), config, policy=ToyPolicy)
    dp_rank = model.shardcore.layout.coordinates(dist.get_rank())["dp"]
    batch = {k: v.chunk(2)[dp_rank] for k, v in toy_batch(batch=4, seq=8).items()}  # this part: 2 x 8 tokens
    seen = []
    metrics = shardcore.StepMetrics(model, log_every=2, peak_flops=PEAK, sinks=[lambda m, step: seen.append(step)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, windows, calls = [], [], []
    for _ in range(4):
        loss = model(**batch)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        with count_c10d_calls() as counted:
            window = metrics.step(loss, tokens=batch["ids"].numel())
        calls.append(dict(counted))
        if window is not None:
            windows.append(window)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, losses)
    unsharded = sum(p.numel() for p in ToyLM().parameters())  # its head reuses the embedding's weight: counted
    return {"windows": windows, "calls": calls, "seen": seen, "losses": everyone, "rank": dist.get_rank(),
            "flops_per_token": metrics.flops_per_token, "unsharded": unsharded}  # fmt: skip


def test_step_metrics_of_an_fsdp_by_tp_loop_are_what_the_ranks_did():
    reports = run_on_ranks(4, _loop)
    for report in reports:
        calls = report["calls"]
        assert calls[0] == {} == calls[2], f"a collective mid-window: {calls}"
        assert calls[1] == {"all_gather_single": 1} == calls[3], f"not one all-gather per window: {calls}"
        assert report["seen"] == ([2, 4] if report["rank"] == 0 else []), report["seen"]
        for w, window in enumerate(report["windows"]):
            steps = [step for ranks in report["losses"] for step in ranks[2 * w : 2 * w + 2]]
            assert abs(window["loss"] - sum(steps) / len(steps)) <= 1e-6 * abs(window["loss"]), (window, steps)
            tokens = window["tokens_per_s"] * window["step_s"] * 2  # the window's two steps
            assert abs(tokens - 2 * 2 * 16) <= 1e-6 * tokens, f"{tokens} tokens counted, not two parts' 2 x 16 once"
            mfu = window["tokens_per_s"] * report["flops_per_token"] / (4 * PEAK)
            assert abs(window["mfu"] - mfu) <= 1e-9 * mfu, window
            memory = [window[f"peak_memory_gb_rank{r}"] for r in range(4)]
            assert min(memory) > 0 and window["peak_memory_gb"] == max(memory), window
    flops = {r["flops_per_token"] for r in reports}
    assert flops == {6 * reports[0]["unsharded"]}, (
        f"FLOPs per token {flops}: not 6 x every parameter (a tied head's in)"
    )


def test_flops_per_token_leaves_out_an_embedding_only_looked_up():
    from shardcore.metrics import model_flops_per_token

    model = ToyLM()
    model.head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())  # untied: the embedding is a lookup
    expected = 6 * (sum(p.numel() for p in model.parameters()) - model.embed.weight.numel())
    got = model_flops_per_token(model)
    assert got == expected, f"FLOPs per token {got}, not 6 x the parameters outside the embedding ({expected})"


def _pipeline() -> dict:
    from recent_models import batch, build

    torch.manual_seed(0)
    model = shardcore.optimize(build("Qwen3", 2), ShardConfig(pipeline_parallel_size=2, tensor_parallel_size=1))
    metrics = shardcore.StepMetrics(model, log_every=1, peak_flops=1e9, stdout=False)
    data = batch(rows=2)
    loss = shardcore.pipeline_step(model, data)  # the whole batch's loss, on every rank
    window = metrics.step(loss, tokens=data["input_ids"].numel())
    return {
        "window": window,
        "flops": metrics.flops_per_token,
        "loss": loss.item(),
        "tokens": data["input_ids"].numel(),
    }


def test_step_metrics_of_a_pipeline_count_each_stage_s_parameters_once():
    from recent_models import build

    from shardcore.metrics import model_flops_per_token

    whole = model_flops_per_token(build("Qwen3", 2))  # the unsharded model, in this process
    for report in run_on_ranks(2, _pipeline):
        window = report["window"]
        assert report["flops"] == whole, f"FLOPs per token {report['flops']} over the stages, unsharded {whole}"
        assert abs(window["loss"] - report["loss"]) <= 1e-6 * report["loss"], report
        tokens = window["tokens_per_s"] * window["step_s"]
        assert abs(tokens - report["tokens"]) <= 1e-6 * tokens, f"{tokens} tokens counted, not {report['tokens']}"
