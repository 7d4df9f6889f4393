"""(``nox -s "engine(name='ray')"``: a fresh environment with ``shardcore[test,ray]`` and transformers.) Ray
Train's ``TorchTrainer`` with ``shardcore.optimize`` in ``train_loop_per_worker`` (``examples/ray_train.py``)
on a local Ray of CPU workers: TP=2 (2 workers) and FSDP=2 x TP=2 (4 workers) give the unsharded loop's
losses, and a second run resumed from the first's checkpoint (shardcore's, reported by rank 0) holds the
trained weights exactly."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from shardcore.testing import example_main

pytestmark = pytest.mark.engine
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "ray_train.py"


@pytest.mark.parametrize("workers", [2, 4])
def test_ray_train_with_shardcore_equals_the_unsharded_loop_and_resumes(workers, tmp_path):
    unsharded = example_main(EXAMPLE)(["--unsharded"])["losses"]
    argv = ["--workers", str(workers), "--tp", "2", "--out", str(tmp_path), "--resume"]
    # as a user runs it: a script (Ray sends train_loop_per_worker from __main__ to the workers by value)
    run = subprocess.run([sys.executable, str(EXAMPLE), *argv], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got["losses"], unsharded, strict=True)), (got, unsharded)
    assert got["resumed_weights"] == got["weights"], got
