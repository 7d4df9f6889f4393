"""``shardcore calibrate``: this machine measured once (matmul throughput, each collective's
latency and bandwidth, memory per rank) into a cached JSON profile."""

from __future__ import annotations

import json
import time

import pytest

from shardcore.cli import main
from shardcore.cost import KINDS, fit_line, load_profile


def test_the_line_fit_recovers_latency_and_bandwidth():
    points = [(n, 2e-5 + n / 3e9) for n in (4096, 65536, 1 << 20, 1 << 22)]
    latency, bandwidth = fit_line(points)
    assert latency == pytest.approx(2e-5, rel=1e-6) and bandwidth == pytest.approx(3e9, rel=1e-6)
    assert fit_line([(10, 1.0), (20, 0.5)])[0] >= 0  # noise that slopes down: clamped, never negative


def test_calibrate_measures_once_and_caches(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHARDCORE_CACHE", str(tmp_path))
    start = time.perf_counter()
    assert main(["calibrate", "--world", "2", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert time.perf_counter() - start < 60, "calibrate takes seconds, not minutes"
    assert first["path"].startswith(str(tmp_path)) and first["backend"] == "gloo"
    assert set(first["matmul_flops"]) == {"float32", "bfloat16"} and min(first["matmul_flops"].values()) > 1e6
    assert first["memory_bytes_per_rank"] > 0
    for kind in KINDS:
        fit = first["collectives"][kind]["2"]
        assert fit["latency_s"] >= 0 and fit["bytes_per_s"] > 0, (kind, fit)
        (big, seconds) = fit["points"][-1]
        predicted = fit["latency_s"] + big / fit["bytes_per_s"]
        assert 0.3 * seconds < predicted < 3 * seconds, (kind, fit)  # the line describes what was measured
    again = load_profile()  # cached: the same profile, nothing measured
    assert again["seconds"] == first["seconds"] and again["collectives"] == first["collectives"]
    assert main(["calibrate", "--world", "2"]) == 0
    assert "latency" in capsys.readouterr().out


def test_calibrate_refuses_a_group_of_one(tmp_path, capsys):
    assert main(["calibrate", "--world", "1", "--out", str(tmp_path / "p.json")]) == 1
    assert "group size 1 must be at least 2" in capsys.readouterr().err
