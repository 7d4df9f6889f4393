"""HuggingFace's own saving on a sharded Llama: ``model.save_pretrained(d)`` on every rank writes
the checkpoint ``from_pretrained`` loads unsharded, for every layout; the mistakes are loud."""

from __future__ import annotations

import os

import pytest
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import assert_save_pretrained_matches, rank_zero_only, run_on_ranks

HARD = {"kv": 2, "tie": True, "vocab": 1001}  # replicated KV heads at TP=4, tied and padded vocabulary


def _save(config: dict, path: str, flag: bool = True, cls_name: str = "LlamaForCausalLM", **batch) -> dict:
    return assert_save_pretrained_matches(
        lambda: build(cls_name, **HARD), lm_batch(1001, **batch), ShardConfig(**config), path, main_process_flag=flag
    )


@pytest.mark.parametrize(
    ("config", "flag"),
    [
        ({"tensor_parallel_size": 2}, True),
        ({"tensor_parallel_size": 2}, False),  # HF's default is_main_process=True on every rank
        ({"tensor_parallel_size": 4}, True),
        ({"pipeline_parallel_size": 2, "tensor_parallel_size": 2, "num_microbatches": 2}, True),
        (
            {
                "tensor_parallel_size": 2,
                "enable_sequence_parallelism": True,
                "sequence_parallelism_mode": "split_gather",
            },
            True,
        ),
        ({"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"}, True),
    ],
    ids=["tp2", "tp2-no-flag", "tp4", "pp2xtp2", "sp-split-gather", "fsdp2xtp2"],
)
def test_save_pretrained_loads_unsharded(config, flag, tmp_path):
    world = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        world *= config.get(key, 1)
    batch = {"batch": 4, "pad": False} if "data_parallel" in config else {}
    reports = run_on_ranks(world, _save, config, str(tmp_path / "ckpt"), flag, **batch)
    assert all(r["tensors"] > 0 for r in reports)
    # HF's files, and the record save_checkpoint writes last (its files and sizes: a complete save)
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "shardcore_checkpoint.json",
    ]


def _save_to(path: str):
    import torch

    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(tensor_parallel_size=2, collective_timeout=3))
    return lambda: model.save_pretrained(path)


@pytest.mark.slow  # a fresh pool waiting out the group's timeout: nox -s tests-slow
def test_save_pretrained_on_one_rank_is_named_and_writes_nothing(tmp_path):
    _, message, other = rank_zero_only(_save_to, str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt").exists(), "a partial directory was left"
    assert message.startswith(("CollectiveTimeout: ", "CollectivePeerLost: ")), message
    assert "save_pretrained of a sharded model: every rank must call it" in message, message
    assert other.startswith("barrier: ")


def _refusals(path: str) -> list[str]:
    import torch

    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(tensor_parallel_size=2))
    out = []
    for kwargs in ({"state_dict": model.state_dict()}, {"push_to_hub": True}, {"safe_serialization": False}):
        try:
            model.save_pretrained(path, **kwargs)
        except ValueError as err:
            out.append(str(err))
    return out


def test_arguments_it_cannot_honour_are_refused_before_any_collective(tmp_path):
    for messages in run_on_ranks(2, _refusals, str(tmp_path / "ckpt")):
        assert len(messages) == 3
        assert "leave state_dict out and call save_pretrained on every rank" in messages[0]
        assert "push_to_hub=True) is not supported" in messages[1] and "safetensors" in messages[2]
    assert not (tmp_path / "ckpt").exists()


def _state_dict_into_unsharded(config: dict) -> str:
    import torch

    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", **HARD), ShardConfig(**config))
    state = model.state_dict()
    plain = build("LlamaForCausalLM", **HARD)
    for strict in (True, False):
        try:
            plain.load_state_dict(state, strict=strict)
        except RuntimeError as err:
            if "size mismatch" not in str(err) and "Missing key" not in str(err):
                raise
        else:
            return f"loaded with strict={strict}"
    return "refused"


@pytest.mark.parametrize(
    "config",
    [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2, "tensor_parallel_size": 2}],
    ids=["tp2", "pp2xtp2"],
)
def test_state_dict_of_slices_fails_loudly_in_the_unsharded_model(config):
    # torch.save(model.state_dict()) holds this rank's slices: load_state_dict refuses them by shape
    world = config.get("pipeline_parallel_size", 1) * config["tensor_parallel_size"]
    assert run_on_ranks(world, _state_dict_into_unsharded, config) == ["refused"] * world


def _save_with_plan(plan: str, path: str) -> dict:
    return _save({"tensor_parallel_size": 2, "plan": plan}, path)


def test_save_pretrained_under_a_yaml_plan(tmp_path):
    from test_llama_plan import LLAMA_PLAN

    (tmp_path / "plan.yaml").write_text(LLAMA_PLAN)
    reports = run_on_ranks(2, _save_with_plan, str(tmp_path / "plan.yaml"), str(tmp_path / "ckpt"))
    assert all(r["tensors"] > 0 for r in reports)
