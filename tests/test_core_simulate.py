"""One process as one rank of a larger world (``shardcore.distributed.init_simulated_world``, torch's
fake backend): every layout of ``benchmarks/bench_simulate.py`` runs at tiny size on the CPU, and each
simulated rank holds exactly the parameter, gradient and optimizer bytes ``explain`` predicts for it.
Each script runs in a fresh process (a fake world is the process's one world)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_simulate.py"


def _python(args: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("simulate") / "simulate.json"
    done = _python([str(BENCH), "--tiny", "--steps", "1", "--runs", "2", "--warmup", "1", "--out", str(out)], ROOT)
    assert done.returncode == 0, f"bench_simulate.py --tiny failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(out.read_text())


def test_every_layout_runs_on_one_simulated_rank(simulated):
    sys.path.insert(0, str(BENCH.parent))
    import bench_simulate

    rows = simulated["results"]
    seen = {(r["layout"], r["contestant"]) for r in rows}
    args = bench_simulate.parse(["--tiny"])
    expected = {(name, c) for name in bench_simulate.LAYOUTS for c in bench_simulate.contestants(name, args)}
    assert {("tp8", "pytorch_tp"), ("tp8", "hf_tp_plan"), ("tp1", "unsharded"), ("tp8", "shardcore+all")} <= expected
    assert seen == expected, f"layouts measured {sorted(seen)} != expected {sorted(expected)}"
    for r in rows:
        assert len(r["step_s_runs"]) == 2 and all(0 < s < 60 for s in r["step_s_runs"]), r
        assert r["held_bytes"]["parameters"] > 0 and r["held_bytes"]["optimizer"] > 0, r
        assert 0 < r["mfu"] < 1, r


def test_each_simulated_rank_holds_what_explain_predicts(simulated):
    for r in simulated["results"]:
        if not r["contestant"].startswith("shardcore"):
            continue
        held, guess = r["held_bytes"], r["predicted"]["memory"]
        assert held["parameters"] == guess["parameters"], (
            f"{r['layout']} (rank {r['rank']} of {r['world']}): parameter bytes held {held['parameters']} != "
            f"explain's {guess['parameters']}"
        )
        assert held["gradients"] == guess["gradients"], (
            f"{r['layout']}: gradient bytes held {held['gradients']} != explain's {guess['gradients']}"
        )
        # AdamW: two states per parameter element, and one float32 step count per tensor
        assert guess["optimizer"] <= held["optimizer"] <= guess["optimizer"] * 1.01, (
            f"{r['layout']}: optimizer bytes held {held['optimizer']} != explain's {guess['optimizer']}"
        )
        assert r["predicted_whole_step_s"] > r["step_s"], r


def test_layouts_differ_as_their_shards_do(simulated):
    """The simulation is not one rank of one layout relabelled: TP=8 holds a quarter of TP=2's blocks."""
    held = {r["layout"]: r["held_bytes"]["parameters"] for r in simulated["results"] if r["contestant"] == "shardcore"}
    assert held["tp8"] < held["tp4"] < held["tp2"], held
    assert held["tp2-pp4-middle"] < held["tp2-pp4-first"], held
    assert held["tp2-fsdp4"] < held["tp2"], held


SCRIPT = textwrap.dedent(
    """
    import warnings, torch, shardcore
    from shardcore.distributed import init_simulated_world, is_simulated
    from transformers import LlamaConfig, LlamaForCausalLM

    init_simulated_world(3, 4)
    assert is_simulated()
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                      vocab_size=128, num_hidden_layers=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = shardcore.optimize(LlamaForCausalLM(cfg), shardcore.ShardConfig(tensor_parallel_size=4))
    print("WARNED:", [str(w.message) for w in caught if "simulated rank" in str(w.message)])
    print("CHECKS:", model.shardcore.config.check_inputs, model.shardcore.config.verify)
    try:
        shardcore.optimize(LlamaForCausalLM(cfg), shardcore.ShardConfig(pipeline_parallel_size=4, num_microbatches=4))
    except ValueError as err:
        print("REFUSED:", err)
    try:
        init_simulated_world(0, 2)
    except RuntimeError as err:
        print("TWICE:", err)
    """
)


def test_a_simulated_rank_says_what_it_cannot_check(tmp_path):
    done = _python(["-c", SCRIPT], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    warned = "shardcore: a simulated rank" in out and "check_inputs" in out and "same-weights" in out
    assert warned, f"no warning naming the checks a simulated rank cannot run: {out}"
    assert "CHECKS: False False" in out, f"a simulated rank's data checks are still on: {out}"
    assert "REFUSED:" in out and "ShardConfig(example_inputs=batch)" in out, f"a pipeline without shapes: {out}"
    assert "TWICE:" in out and "initialized already" in out, out
