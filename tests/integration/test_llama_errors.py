"""Bad input to shard-llama gets a clear error on every rank, before any collective."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types

import pytest
from llama_cases import build

import shardcore
from shardcore import ShardConfig, hookimpl
from shardcore.plugins import NoPolicyError, PluginRegistry
from shardcore.testing import refusal_message, run_on_ranks


def _error(tp: int, **cfg) -> str:
    return refusal_message(lambda: build("LlamaForCausalLM", **cfg), ShardConfig(tensor_parallel_size=tp))


@pytest.mark.parametrize(
    ("world", "cfg", "expected"),
    [
        (4, {"heads": 6, "kv": 6, "hidden": 48}, "num_attention_heads=6 is not divisible by tensor_parallel_size=4"),
        (2, {"intermediate": 129}, "intermediate_size=129 is not divisible by tensor_parallel_size=2"),
        (2, {"heads": 6, "kv": 3, "hidden": 48}, "num_key_value_heads=3 can neither be split over nor replicated"),
    ],
)
def test_indivisible_shapes(world, cfg, expected):
    messages = run_on_ranks(world, _error, world, **cfg)
    assert all(expected in m and "LlamaForCausalLM" in m for m in messages), messages


def test_three_ranks_eight_heads():
    messages = run_on_ranks(3, _error, 3, heads=8, kv=8)
    assert all("num_attention_heads=8 is not divisible by tensor_parallel_size=3" in m for m in messages), messages
    assert all("[1, 2, 4, 8]" in m for m in messages), messages


def test_tp_larger_than_world():
    with pytest.raises(ValueError, match="tensor_parallel_size=2 is larger than the world size 1"):
        shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(tensor_parallel_size=2))


def test_model_without_plugin_names_class_plugins_and_fix():
    import transformers

    config = transformers.GPTNeoConfig(
        hidden_size=32, num_layers=1, num_heads=2, vocab_size=64, attention_types=[[["global"], 1]]
    )
    model = transformers.GPTNeoForCausalLM(config)  # no plugin covers it, and its config has no tp_plan
    with pytest.raises(NoPolicyError) as err:
        shardcore.optimize(model)
    msg = str(err.value)
    assert "transformers.models.gpt_neo.modeling_gpt_neo.GPTNeoForCausalLM" in msg
    assert "llama (" in msg and "LlamaForCausalLM" in msg
    assert "policy=" in msg


def test_broken_plugin_is_skipped_and_llama_still_works(monkeypatch, tmp_path):
    (tmp_path / "fake_raising_plugin.py").write_text("raise RuntimeError('boom at import time')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = [ep for ep in md.entry_points(group="shardcore") if ep.name == "llama"]
    assert real, "shard-llama must be installed for this test"
    broken = types.ModuleType("fake_broken_plugin")

    def shardcore_register_policies(register):
        raise ImportError("this plugin needs a library that is not installed")

    broken.shardcore_register_policies = hookimpl(shardcore_register_policies)
    monkeypatch.setitem(sys.modules, "fake_broken_plugin", broken)
    eps = [
        md.EntryPoint("raises_on_import", "fake_raising_plugin", "shardcore"),
        md.EntryPoint("broken", "fake_broken_plugin", "shardcore"),
        *real,
    ]
    installed = md.entry_points

    def entry_points(group=None, **select):  # other groups (triton's, read by a lazy torch._dynamo): installed
        if group == "shardcore":
            return md.EntryPoints(eps)
        return installed(group=group, **select) if group is not None else installed(**select)

    monkeypatch.setattr(md, "entry_points", entry_points)
    registry = PluginRegistry().load()
    assert "RuntimeError: boom at import time" in registry.plugins["raises_on_import"].error
    assert "not installed" in registry.plugins["broken"].error
    assert registry.plugins["llama"].error is None
    policy = registry.get_policy(build("LlamaForCausalLM"))
    assert type(policy).__name__ == "LlamaForCausalLMPolicy"


def test_sequence_parallelism_needs_a_tensor_parallel_group():
    with pytest.raises(
        ValueError, match=r"splits the sequence over the tensor-parallel group.*tensor_parallel_size > 1"
    ):
        shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(enable_sequence_parallelism=True))
