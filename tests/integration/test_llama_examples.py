"""The workflow examples under ``examples/`` run, at their tiny size, on real gloo ranks (the same
``main`` torchrun would run on each rank)."""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import pytest

from shardcore.testing import example_main, run_on_ranks

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    return example_main(EXAMPLES / f"{name}.py")


def test_finetune_with_the_trainer_tp_x_dp(tmp_path):
    losses = run_on_ranks(4, _example("finetune_trainer"), ["--tp", "2", "--steps", "1", "--out", str(tmp_path)])
    assert all(len(x) == 1 and all(math.isfinite(v) for v in x) for x in losses)
    assert losses[0] == losses[1] == losses[2] == losses[3]  # logged over every rank alike
    assert (tmp_path / "checkpoint-1" / "model.safetensors").is_file()


def test_lora_finetune(tmp_path):
    losses = run_on_ranks(2, _example("lora_finetune"), ["--out", str(tmp_path)])
    assert losses[0] == losses[1] and losses[0][-1] < losses[0][0]  # it trains
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "merged" / "model.safetensors").is_file()


@pytest.mark.parametrize("tp", [2])
def test_save_and_reload(tp, tmp_path):
    diffs = run_on_ranks(tp, _example("save_and_reload"), ["--tp", str(tp), "--out", str(tmp_path)])
    for per_rank in diffs:  # from_pretrained, save_checkpoint + from_pretrained, init_empty + load_checkpoint
        assert len(per_rank) == 3 and max(per_rank) <= 1e-5, per_rank


def test_pipeline_training_equals_the_unsharded_loop():
    losses = run_on_ranks(4, _example("pipeline_training"), ["--steps", "2"])
    unsharded = _example("pipeline_training")(["--unsharded", "--steps", "2"])  # this process, the plain model
    for got in losses:
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, unsharded, strict=True)), (got, unsharded)


def test_fsdp_x_tp_training_equals_the_unsharded_loop():
    losses = run_on_ranks(4, _example("fsdp_tp_training"), [])
    unsharded = _example("fsdp_tp_training")(["--unsharded"])
    for got in losses:
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, unsharded, strict=True)), (got, unsharded)


def test_long_sequence_training_equals_the_unsharded_loop():
    losses = run_on_ranks(2, _example("long_sequence_sp"), [])
    unsharded = _example("long_sequence_sp")(["--unsharded"])
    for got in losses:
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, unsharded, strict=True)), (got, unsharded)


def test_inference_with_parallelize_equals_unsharded_generate():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens = _example("inference_parallelize")(["--world-size", "2"])
    torch.manual_seed(0)  # the example's model
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert tokens == want.tolist()


def _readme_block(text: str) -> str:
    """The lines of ``examples/quickstart.py`` between its ``readme`` markers, dedented."""
    import textwrap

    start, end = text.index("# --8<-- [start:readme]\n"), text.index("# --8<-- [end:readme]")
    body = text[start:end].split("\n", 1)[1]
    return textwrap.dedent(body.rsplit("\n", 1)[0] + "\n")


def test_the_readme_example_is_the_tested_file_and_matches_unsharded():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    block = _readme_block((EXAMPLES / "quickstart.py").read_text())
    readme = (EXAMPLES.parent / "README.md").read_text()
    assert f"```python\n{block}```" in readme, "README's example differs from examples/quickstart.py"
    results = run_on_ranks(2, _example("quickstart"), [])
    torch.manual_seed(0)
    cfg = dict(hidden_size=256, intermediate_size=688, num_attention_heads=8, num_hidden_layers=4, vocab_size=1001)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    ids = torch.randint(0, 1001, (4, 128))
    loss = model(input_ids=ids, labels=ids).loss.item()
    tokens = model.generate(ids[:, :8], max_new_tokens=16, do_sample=False)
    for got_loss, got_tokens in results:
        assert abs(got_loss - loss) <= 1e-5 * abs(loss), (got_loss, loss)
        assert torch.equal(got_tokens, tokens)


def test_auto_layout_trains_like_the_unsharded_loop(tmp_path):
    import json

    from test_llama_auto import synthetic_profile

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(synthetic_profile(shared=True)))
    runs = run_on_ranks(4, _example("auto_layout"), ["--profile", str(profile)])
    _, unsharded = _example("auto_layout")(["--unsharded"])
    assert len({name for name, _ in runs}) == 1 and runs[0][0] != "1 rank", runs  # every rank chose the same
    for _, got in runs:
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, unsharded, strict=True)), (got, unsharded)


#: the examples a user launches with torchrun as they are: none tears the process group down
NO_TEARDOWN = {"quickstart": (2, []), "pipeline_training": (4, ["--steps", "2"]), "fsdp_tp_training": (4, [])}
RUNS = 2  # each, in a row: a finished run's exit is where the abort happened (docs: shardcore.distributed.retain)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NO_TEARDOWN))
def test_an_example_without_teardown_exits_0_on_every_rank(name):
    """The README's quickstart, the pipeline and the FSDP x TP examples under torchrun, RUNS times in
    a row, with no destroy_process_group: every rank exits 0, nothing says 'terminate called'."""
    ranks, args = NO_TEARDOWN[name]
    script = str(EXAMPLES / f"{name}.py")
    for run in range(RUNS):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), script]
        done = subprocess.run(
            [*cmd, *args], capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        said = done.stdout + done.stderr
        assert done.returncode == 0 and "terminate called" not in said, (
            f"{name}, run {run}: exit {done.returncode}\n{said[-3000:]}"
        )
