"""``nox -s bench-gpu``'s script runs here at tiny size on CPU: the code path a GPU run takes
(each contestant built, stepped and compared, MFU computed), not its figures."""

from __future__ import annotations

import json
import pathlib

import pytest

from shardcore.testing import example_main

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"


@pytest.mark.slow  # ~15 s: nox -s tests-slow (CI: one part in its turn, .ci/run)
def test_bench_gpu_runs_tiny_on_cpu(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    example_main(BENCH)(["--tiny", "--tp", "1", "2", "--steps", "2", "--warmup", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "MFU = tokens/s x (6N + 12 L d S) / (tp x peak)" in printed, printed
    rows = json.loads(out.read_text())["results"]
    assert [(r["tp"], r["name"]) for r in rows] == [
        (1, "unsharded"),
        (1, "shardcore"),
        (1, "pytorch_tp"),
        (2, "shardcore"),
        (2, "pytorch_tp"),
        (2, "hf_tp_plan"),
    ]
    assert all(r["time_vs_unsharded"] > 0 and r["memory_vs_unsharded"] > 0 for r in rows), rows
    for r in rows:  # the losses agree (main checks it) and every figure is computed
        assert r["step_s"] > 0 and r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["peak_mem_bytes_per_device"] > 0, r
        assert r["loss"] == rows[0]["loss"] or abs(r["loss"] - rows[0]["loss"]) <= 1e-4 * abs(rows[0]["loss"]), r
