"""shard-llama with the optimization switches, and ``shardcore explain`` against real steps."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import assert_explain_matches, run_on_ranks


def _explain(tp: int, kv: int, layers: int) -> dict:
    return assert_explain_matches(
        lambda: build("LlamaForCausalLM", kv=kv, layers=layers), lm_batch(), ShardConfig(tensor_parallel_size=tp)
    )


@pytest.mark.parametrize(("tp", "kv", "layers"), [(2, 2, 1), (2, 4, 3), (4, 2, 2)], ids=["gqa", "mha", "replicated-kv"])
def test_explain_predicts_a_step(tp, kv, layers):
    """explain (meta device, no process group) predicts the collectives of a real forward and
    backward, by kind, and the bytes rank 0 holds; replicated KV heads add their gradient sums."""
    reports = run_on_ranks(tp, _explain, tp, kv, layers)
    per_layer = reports[0]["collectives_per_layer"]["LlamaDecoderLayer"]
    assert per_layer["forward"] == {"all_reduce": 2}
    assert per_layer["backward"]["all_reduce"] == (2 if tp <= kv else 2 + 2)


LLAMA_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


_MEASURED_CLI = (
    "import resource, sys\n"
    "from shardcore.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _cli(*args: str) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run the ``shardcore`` command line in a fresh interpreter: result, seconds, its own peak RSS in bytes."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _MEASURED_CLI, *args], capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    peak = int(proc.stderr.rsplit("peak_rss_kb", 1)[1].split()[0]) * 1024 if "peak_rss_kb" in proc.stderr else -1
    return proc, seconds, peak


@pytest.fixture(scope="module")
def llama_7b(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-7b")
    (path / "config.json").write_text(json.dumps(LLAMA_7B))
    return path


def test_explain_7b_at_tp4(llama_7b):
    """A Llama-2-7B-shaped config at TP=4: seconds and well under 1 GB (the meta device: nothing
    allocated), each rank a quarter of the model within 1%."""
    proc, seconds, peak = _cli("explain", str(llama_7b), "--tp", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    hidden, inter, layers, vocab, kv_dim = 4096, 11008, 32, 32000, 1024
    full = 4 * (
        layers * (2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * inter + 2 * hidden)
        + 2 * vocab * hidden
        + hidden
    )
    assert report["bytes_unsharded"] == full
    assert abs(report["bytes_per_rank"] / (full / 4) - 1) < 0.01, report["fraction_per_rank"]
    assert report["collectives_per_layer"]["LlamaDecoderLayer"]["forward"] == {"all_reduce": 2}
    assert seconds < 20, seconds
    assert peak < 1024**3, f"peak RSS {peak / 2**20:.0f} MB"
    print(f"explain 7B at TP=4: {seconds:.1f} s, peak RSS {peak / 2**20:.0f} MB")


def test_explain_refuses_tp3(llama_7b):
    """An impossible layout: non-zero exit, optimize's message naming the field and the valid sizes, no traceback."""
    proc, _, _ = _cli("explain", str(llama_7b), "--tp", "3")
    assert proc.returncode == 1
    assert "num_attention_heads=32 is not divisible by tensor_parallel_size=3" in proc.stderr, proc.stderr
    assert "[1, 2, 4, 8, 16, 32]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_explain_table_and_bad_spec(llama_7b):
    proc, _, _ = _cli("explain", str(llama_7b), "--tp", "2", "--pp", "2")
    assert proc.returncode == 0, proc.stderr
    assert "model.layers.*.self_attn.q_proj" in proc.stdout and "Linear1D_Col" in proc.stdout
    assert "pipeline stages (per rank)" in proc.stdout
    assert "not built in this shardcore version" in proc.stdout
    proc, _, _ = _cli("explain", "no_such_module:Model", "--tp", "2")
    assert proc.returncode == 1 and "cannot import 'no_such_module:Model'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
