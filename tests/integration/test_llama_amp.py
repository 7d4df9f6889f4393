"""fp16 loss scaling with the user's own ``torch.amp.GradScaler`` on a sharded Llama: an inf in one rank's
gradient slice skips the step on every rank of the mesh, and every rank's scale moves together, as the
unsharded model's scaler decides (tensor, data and pipeline parallelism, on gloo ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from llama_cases import build, lm_batch

import shardcore
from shardcore import ShardConfig
from shardcore.pipeline import PipelineHole
from shardcore.testing import dp_part, run_on_ranks

CFG = {"kv": 2, "layers": 2}
SPOILED_STEP, SPOILED_RANK = 1, 1


def _spoil(module: torch.nn.Module, step: list[int]) -> None:
    """At step ``SPOILED_STEP``, rank ``SPOILED_RANK``'s gradient of ``module.weight`` gets an inf in its first
    entry (this rank's slice only), hooked on the weight the forward uses (under FSDP the gathered one, whose
    gradient is then reduce-scattered: the inf lands on the data-parallel rank owning that row)."""

    def hook(grad):
        if step[0] == SPOILED_STEP and dist.get_rank() == SPOILED_RANK:
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
        return grad

    def arm(mod, args):
        if torch.is_grad_enabled() and mod.weight.requires_grad:
            mod.weight.register_hook(hook)

    module.register_forward_pre_hook(arm)


def _local(param: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``param`` (its FSDP shard: compared locally, no collective)."""
    return param.detach().to_local() if hasattr(param, "to_local") else param.detach()


def _train(config: dict, spoil: bool) -> dict:
    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", **CFG), ShardConfig(**config))
    layout = model.shardcore.layout
    batch = lm_batch(batch=4, pad=False)
    if model.shardcore.data_parallel:
        batch = dp_part(batch, layout.coordinates(dist.get_rank())["dp"], layout.dp)
    step = [0]
    if spoil:  # a weight every layout splits or holds on the spoiled rank: a block's up projection
        block = model.model.layers[1 if layout.pp > 1 else 0]  # under pipeline parallelism: the second stage's
        if not isinstance(block, PipelineHole):  # (a hole on the first stage's ranks)
            _spoil(block.mlp.up_proj, step)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**13)
    scales, stepped = [], []
    for step[0] in range(3):
        before = [_local(p).clone() for p in model.parameters()]
        with torch.autocast("cpu", dtype=torch.float16):
            if layout.pp > 1:
                loss = shardcore.pipeline_step(model, batch, loss_scale=scaler.scale)
            else:
                loss = model(**batch).loss
                scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        stepped.append(any(not torch.equal(b, _local(p)) for b, p in zip(before, model.parameters(), strict=True)))
    return {"scales": scales, "stepped": stepped, "loss": float(loss.detach())}


@pytest.mark.parametrize(
    "config",
    [
        {"tensor_parallel_size": 2},
        {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"},
        {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "ddp"},
        {"pipeline_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp", "num_microbatches": 2},
    ],
    ids=["tp2", "fsdp2xtp2", "ddp2xtp2", "pp2xfsdp2"],
)
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(config):
    world = config.get("tensor_parallel_size", 1) * config.get("data_parallel_size", 1)
    world *= config.get("pipeline_parallel_size", 1)
    reports = run_on_ranks(world, _train, config, True)
    for rank, r in enumerate(reports):  # the spoiled step skipped, the scale halved, the others stepped: everywhere
        assert r["stepped"] == [True, False, True], f"rank {rank} stepped {r['stepped']}, scales {r['scales']}"
        assert r["scales"] == [2.0**13, 2.0**12, 2.0**12], f"rank {rank} scales {r['scales']}"
    clean = run_on_ranks(world, _train, config, False)
    assert all(r["stepped"] == [True, True, True] and r["scales"] == [2.0**13] * 3 for r in clean), clean
