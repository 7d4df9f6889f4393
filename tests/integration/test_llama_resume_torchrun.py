"""Crash and resume under torchrun: a Llama job at TP=2 checkpointing every step, one rank killed
(SIGKILL) inside step 3's checkpoint save, restarted by ``torchrun --max-restarts 1``, resumes from
the newest complete checkpoint and ends with the uninterrupted run's losses and weights, exactly:
a plain loop with ``save_distributed`` (``jobs/resume_dcp.py``) and ``shardcore.hf.Trainer``
(``jobs/resume_trainer.py``, its checkpoint-3 interrupted and passed over). Fresh processes each:
nox -s tests-slow."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

JOBS = pathlib.Path(__file__).parent / "jobs"
STEPS = 5


def _torchrun(out: pathlib.Path, *extra: str, restarts: int = 0, job: str = "resume_dcp.py") -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["--max-restarts", str(restarts), str(JOBS / job), str(out), *extra]
    out.mkdir(parents=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    (out / "torchrun.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


def _same_run(tmp_path: pathlib.Path, whole: list[dict], crashed: list[dict], what: str) -> None:
    """The killed-and-resumed run's losses (each step's as the attempt that went on computed it)
    and final weights are the uninterrupted run's, exactly."""
    last = {r["step"]: r["loss"] for r in crashed}
    print(f"{what}, uninterrupted:", [r["loss"] for r in whole])
    print(f"{what}, killed at step 3 and resumed:", [last[s] for s in sorted(last)])
    assert [last[s] for s in sorted(last)] == [r["loss"] for r in whole], f"{what}: the resumed run's losses differ"
    a, b = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("whole", "crashed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"{what}: the resumed run's weights differ"


@pytest.mark.slow
def test_a_job_killed_mid_save_and_restarted_by_torchrun_reproduces_the_uninterrupted_run(tmp_path):
    whole = _torchrun(tmp_path / "whole", "--steps", str(STEPS))
    crashed = _torchrun(tmp_path / "crashed", "--steps", str(STEPS), "--crash-at", "3", restarts=1)
    assert [r["attempt"] for r in whole] == [0] * STEPS
    # attempt 0 ran steps 0-3 and died saving step 3; attempt 1 started at 3 from step-2's checkpoint
    assert [(r["step"], r["attempt"]) for r in crashed] == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (4, 1)]
    assert crashed[-1]["start"] == 3
    _same_run(tmp_path, whole, crashed, "the loop")
    assert not list((tmp_path / "crashed").glob(".step-*")), "a staging directory was left behind"


@pytest.mark.slow
def test_a_trainer_killed_mid_checkpoint_and_restarted_by_torchrun_reproduces_the_uninterrupted_run(tmp_path):
    whole = _torchrun(tmp_path / "whole", job="resume_trainer.py")
    crashed = _torchrun(tmp_path / "crashed", "--crash-at", "3", restarts=1, job="resume_trainer.py")
    # attempt 0 logged steps 1-3 and died writing checkpoint-3; attempt 1 resumed from checkpoint-2
    assert [(r["step"], r["attempt"]) for r in crashed] == [(1, 0), (2, 0), (3, 0), (3, 1), (4, 1), (5, 1)]
    log = (tmp_path / "crashed" / "torchrun.log").read_text()
    assert "passing over: shardcore.hf.Trainer checkpoint" in log and "checkpoint-3 was never completed" in log, log
    _same_run(tmp_path, whole, crashed, "the Trainer")
