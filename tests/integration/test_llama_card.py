"""``shardcore check`` on a Llama: the card of TP=2 and Ulysses x FSDP passes with every part's
gradients compared (PP=2 x TP=2: the example, from a config directory); the command line prints it (``--json`` for CI), says what it reduced,
and ends a refused layout with optimize's own message, before any process is a rank of it."""

from __future__ import annotations

import json
import pathlib

import pytest
from llama_cases import build, lm_batch

import shardcore
from shardcore import ShardConfig
from shardcore.card import LayoutRefused
from shardcore.cli import main

LAYOUTS = {
    "tp2": {"tensor_parallel_size": 2},
    "ulysses2-fsdp2": {
        "tensor_parallel_size": 1,
        "sequence_parallel_size": 2,
        "enable_sequence_parallelism": True,
        "sequence_parallelism_mode": "all_to_all",
        "data_parallel": "fsdp",
        "data_parallel_size": 2,
    },
}


def tiny_llama():
    return build("LlamaForCausalLM", heads=4, kv=2, layers=4, tie=True, vocab=1001)


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_the_card_of_a_right_layout_passes_with_every_part_compared(layout):
    card = shardcore.check(tiny_llama, ShardConfig(**LAYOUTS[layout]), batch=lm_batch(1001, batch=4, seq=32))
    print("\n" + card.format())
    assert card.passed, card.format()
    whats = [r.what for r in card.rows]
    for part in ("embeddings", "attention", "mlp", "norms"):  # the head is tied to the embedding here
        assert f"gradients: {part}" in whats, whats
    assert whats[:2] == ["loss, step 1", "loss, step 2"] and "parameters after 2 steps" in whats
    assert all(r.error < r.tolerance for r in card.rows), card.format()
    assert card.collectives.get("all_reduce") and card.world == 4 - 2 * (layout == "tp2")
    if layout == "ulysses2-fsdp2":  # FSDP's own collectives run through torch.distributed, not shardcore's
        assert card.collectives["all_to_all"] and card.torch_calls["reduce_scatter_single"], card.torch_calls


def _config_dir(tmp_path, **overrides):
    import transformers

    shape = {"vocab_size": 1001, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    shape |= {"num_attention_heads": 4, "num_key_value_heads": 2, **overrides}
    transformers.LlamaConfig(architectures=["LlamaForCausalLM"], pad_token_id=0, **shape).save_pretrained(tmp_path)
    return str(tmp_path)


def test_the_command_prints_the_card_as_json_and_says_what_it_reduced(tmp_path, capsys):
    assert main(["check", _config_dir(tmp_path), "--tp", "2", "--reduce", "--json"]) == 0
    said = capsys.readouterr()
    card = json.loads(said.out)
    assert "shardcore check: tp2 on 2 local processes beside the unsharded model, 2 steps" in said.err, said.err
    assert card["passed"] and card["layout"] == "tp2" and card["world"] == 2
    assert card["reduced"] == {"head_dim": [16, 8], "hidden_size": [64, 32], "intermediate_size": [128, 64]}
    assert {r["what"] for r in card["rows"]} >= {"gradients: attention", "clip_grad_norm_'s norm"}


def test_a_refused_layout_ends_with_optimize_s_message(tmp_path, capsys):
    three_heads = _config_dir(tmp_path, hidden_size=48, num_attention_heads=3, num_key_value_heads=3)
    assert main(["check", three_heads, "--tp", "2"]) == 2
    err = capsys.readouterr().err
    assert "shardcore.optimize refused the layout" in err and "divisible" in err, err
    with pytest.raises(LayoutRefused, match="num_attention_heads"):
        shardcore.check(three_heads, ShardConfig(tensor_parallel_size=2))


def test_a_world_larger_than_the_machine_is_built_whole_and_checked_at_two_per_dimension(tmp_path):
    """PP=4 x TP=4 (16 ranks): every rank's coordinates built on the fake backend, the numbers at PP=2 x TP=2;
    PP=8 over 4 layers is refused by the whole world's build, before any real rank runs."""
    four_kv = _config_dir(tmp_path, num_key_value_heads=4, num_hidden_layers=4)
    card = shardcore.check(four_kv, ShardConfig(tensor_parallel_size=4, pipeline_parallel_size=4))
    print("\n" + card.format())
    assert card.passed and card.world == 16 and card.layout == "pp4 x tp4, its numbers checked at pp2 x tp2"
    build, held = card.rows[:2]
    assert build.what == "build at 16 ranks" and build.where == "8 of 16 ranks built on the fake backend", build
    assert held.what == "parameters held at 16 ranks" and held.passed, held
    assert "gradients: attention" in [r.what for r in card.rows] and card.collectives["all_reduce"]
    with pytest.raises(LayoutRefused, match="at 32 ranks"):
        shardcore.check(four_kv, ShardConfig(tensor_parallel_size=4, pipeline_parallel_size=8))


def test_bad_input_is_refused_before_any_process_starts(tmp_path, capsys):
    big = ShardConfig(tensor_parallel_size=4, pipeline_parallel_size=4)
    with pytest.raises(ValueError, match="give one batch"):
        shardcore.check(tiny_llama, big, batch=[lm_batch(1001)])
    with pytest.raises(ValueError, match="one per data-parallel rank"):
        shardcore.check(tiny_llama, ShardConfig(tensor_parallel_size=2), batch=[lm_batch(1001)] * 2)
    with pytest.raises(ValueError, match="needs batch="):
        shardcore.check(tiny_llama, ShardConfig(tensor_parallel_size=2))
    assert main(["check", _config_dir(tmp_path), "--dp", "2"]) == 2
    assert "--dp 2 needs --data-parallel" in capsys.readouterr().err


def test_the_example_checks_a_config_directory_at_two_layouts():
    from shardcore.testing import example_main

    cards = example_main(pathlib.Path(__file__).resolve().parents[2] / "examples" / "check_layout.py")([])
    assert [c.layout for c in cards] == ["tp2", "pp2 x tp2"] and all(c.passed for c in cards), [
        c.format() for c in cards
    ]
