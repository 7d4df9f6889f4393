"""The user's own gradient clipping on a sharded Llama: ``torch.nn.utils.clip_grad_norm_`` (and
``model.clip_grad_norm_``, ``shardcore.clip_grad_norm_``) gives the unsharded model's norm and
clipped gradients for every layout, on real gloo ranks."""

from __future__ import annotations

import pytest
from llama_cases import build, lm_batch, over_sp_refused_before_v5

from shardcore import ShardConfig
from shardcore.testing import CLIP_CALLS, assert_clipping_matches, rank_zero_only, run_on_ranks

# grouped-query attention (KV heads replicated at TP=4), tied and padded vocabulary
HARD = {"kv": 2, "tie": True, "vocab": 1001}


def _clip(config: dict, how: str = "torch", norm_type: float = 2.0, cfg: dict | None = None, **batch) -> dict:
    cfg = HARD if cfg is None else cfg
    return assert_clipping_matches(
        lambda: build("LlamaForCausalLM", **cfg),
        lm_batch(cfg.get("vocab", 128), **batch),
        ShardConfig(**config),
        how=how,
        norm_type=norm_type,
    )


def _show(label: str, reports: list[dict]) -> None:
    norms = sorted({round(r["norm"], 6) for r in reports})
    print(f"\n{label}: norm on every rank {norms}, unsharded {reports[0]['norm_unsharded']:.6f}")
    assert all(r["norm_rel_diff"] <= 1e-5 for r in reports)


@pytest.mark.parametrize("tp", [2, 4])
def test_torch_clip_grad_norm_is_the_unsharded_norm(tp):
    _show(f"TP={tp}", run_on_ranks(tp, _clip, {"tensor_parallel_size": tp}))


def _every_way(config: dict, **batch) -> list[dict]:
    return [_clip(config, how, 2.0, None, **batch) for how in CLIP_CALLS if how != "torch"]


@pytest.mark.parametrize(
    "config",
    [{"tensor_parallel_size": 2}, {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"}],
    ids=["tp2", "fsdp2xtp2"],  # FSDP: gradients are DTensors, the norm comes back as one
)
def test_every_way_in(config):
    # torch's function bound before shardcore, the model's own method, shardcore's function (on the
    # model and on its parameters)
    world = config["tensor_parallel_size"] * config.get("data_parallel_size", 1)
    batch = {"batch": 4, "pad": False} if "data_parallel" in config else {}
    for reports in run_on_ranks(world, _every_way, config, **batch):
        for how, report in zip([h for h in CLIP_CALLS if h != "torch"], reports, strict=True):
            assert report["norm_rel_diff"] <= 1e-5, (how, report)


@pytest.mark.parametrize("norm_type", [1.0, float("inf")])
def test_other_norms(norm_type):
    # TP=4: the infinity norm must skip the padding rows, the 1-norm count replicated KV heads once
    _show(f"norm_type={norm_type}", run_on_ranks(4, _clip, {"tensor_parallel_size": 4}, "torch", norm_type))


@pytest.mark.parametrize(
    "config",
    [
        {"pipeline_parallel_size": 2, "num_microbatches": 2},
        {"pipeline_parallel_size": 2, "tensor_parallel_size": 2, "num_microbatches": 2},
        {"tensor_parallel_size": 2, "enable_sequence_parallelism": True, "sequence_parallelism_mode": "split_gather"},
        {"sequence_parallel_size": 2, "enable_sequence_parallelism": True, "sequence_parallelism_mode": "all_to_all"},
        {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"},
        {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "ddp"},
    ],
    ids=["pp2", "pp2xtp2", "sp-split-gather", "sp-ulysses", "fsdp2xtp2", "ddp2xtp2"],
)
def test_layouts(config):
    world = config.get("pipeline_parallel_size", 1) * config.get("tensor_parallel_size", 1)
    world *= config.get("data_parallel_size", 1) * config.get("sequence_parallel_size", 1)
    if over_sp_refused_before_v5(world, config):
        pytest.skip("transformers 4.x: refused by name (checked); the clipping check needs transformers 5")
    batch = {"batch": 4, "pad": False} if "data_parallel" in config else {}
    _show(str(config), run_on_ranks(world, _clip, config, "torch", 2.0, None, **batch))


def test_zero_bubble_schedule():
    """A zero-bubble schedule sets a later stage's weight gradients itself (no autograd accumulation, so
    no post-accumulate hook): pipeline_step marks them after the schedule, and torch's norm is right."""
    config = {"pipeline_parallel_size": 2, "num_microbatches": 2, "pipeline_schedule": "ZBVZeroBubble"}
    _show("ZBV pp2", run_on_ranks(2, _clip, config, "torch", 2.0, {**HARD, "layers": 4}))


def _plan(path: str, tp: int) -> dict:
    return _clip({"tensor_parallel_size": tp, "plan": path}, cfg={"kv": 2, "vocab": 1001})


@pytest.mark.parametrize("tp", [2, 4])
def test_yaml_plan(tp, tmp_path):
    from test_llama_plan import LLAMA_PLAN

    path = tmp_path / "plan.yaml"
    path.write_text(LLAMA_PLAN)
    _show(f"plan TP={tp}", run_on_ranks(tp, _plan, str(path), tp))


def _mixed() -> str:
    import torch

    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(tensor_parallel_size=2))
    model(**lm_batch()).loss.backward()
    other = torch.nn.Parameter(torch.ones(3))
    other.grad = torch.ones(3)
    try:
        torch.nn.utils.clip_grad_norm_([*model.parameters(), other], 1.0)
    except ValueError as err:
        return str(err)
    return "no error"


def test_gradients_mixed_with_other_tensors_are_refused_on_every_rank():
    for message in run_on_ranks(2, _mixed):
        assert "together with 1 other tensor(s)" in message and "shardcore.clip_grad_norm_(model" in message, (
            f"mixed gradients were not refused: {message}"
        )


def _clip_on(config: dict):
    import torch

    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(**config))
    model(**lm_batch()).loss.backward()
    return lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


@pytest.mark.slow  # a fresh pool waiting out the group's timeout: nox -s tests-slow
def test_clipping_on_one_rank_only_names_the_cause():
    _, message, other = rank_zero_only(_clip_on, {"tensor_parallel_size": 2, "collective_timeout": 3})
    assert message.startswith(("CollectiveTimeout: ", "CollectivePeerLost: ")), message
    assert "gradient norm (clip_grad_norm_): every rank of the model must call it" in message, message
    assert ("waited more than 3 s" in message or "lost a peer" in message) and other.startswith("barrier: ")
