"""The cluster recipes of docs/clusters.md, run as two "nodes" on this machine, one rendezvous on
127.0.0.1: examples/clusters/torchrun_multinode.sh launched once per node, and the two sbatch scripts
whole, their ``srun`` and ``scontrol`` played by stand-ins that start every task of a 2-node allocation
with SLURM's variables (``sbatch`` itself, a real allocation and NCCL across machines are not run); each
rank's quickstart loss equal to the unsharded model's."""

from __future__ import annotations

import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "examples" / "clusters"
QUICKSTART = str(ROOT / "examples" / "quickstart.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unsharded_loss() -> float:
    """The quickstart's lines without optimize: the loss every rank must print."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = dict(hidden_size=256, intermediate_size=688, num_attention_heads=8, num_hidden_layers=4, vocab_size=1001)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    ids = torch.randint(0, 1001, (4, 128))
    return model(input_ids=ids, labels=ids).loss.item()


def _launch_two(script: str, per_node: list[dict]) -> list[str]:
    """Start ``bash script QUICKSTART`` once per entry of ``per_node`` (its environment), wait for all."""
    base = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    base["MASTER_PORT"] = str(_free_port())
    procs = [
        subprocess.Popen(
            ["bash", str(CLUSTERS / script), QUICKSTART],
            env={**base, **env},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for env in per_node
    ]
    outs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{out[-3000:]}"
            outs.append(out)
    finally:
        for proc in procs:
            proc.kill()
    return outs


def _losses(outs: list[str]) -> list[float]:
    return [float(m) for out in outs for m in re.findall(r"loss (\d+\.\d+), tokens", out)]


@pytest.mark.slow
def test_two_nodes_of_torchrun_give_the_unsharded_loss():
    """torchrun_multinode.sh on two "nodes" (NODE_RANK 0 and 1, one rank each, c10d rendezvous)."""
    nodes = [{"NNODES": "2", "NODE_RANK": str(r), "NPROC_PER_NODE": "1", "RUN_ID": "test"} for r in (0, 1)]
    losses = _losses(_launch_two("torchrun_multinode.sh", nodes))
    assert len(losses) == 2, losses
    expected = _unsharded_loss()
    assert all(abs(loss - expected) <= 1e-5 * abs(expected) + 1e-6 for loss in losses), (losses, expected)


#: SLURM's srun as it runs a job step: every task of the allocation at once, each with its variables
FAKE_SRUN = """#!/usr/bin/env bash
n=$SLURM_NTASKS; per=$((n / SLURM_NNODES)); pids=()
for ((i = 0; i < n; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=$((i % per)) SLURM_NODEID=$((i / per)) SLURM_NTASKS_PER_NODE=$per "$@" &
    pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""


def _sbatch(script: str, tmp_path: pathlib.Path) -> str:
    """``script`` run as the batch step of a 2-node allocation (one task a node, one CPU "GPU" each)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho 127.0.0.1\n")  # show hostnames: node 0
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable}
    env |= {"OMP_NUM_THREADS": "1", "MASTER_PORT": str(_free_port()), "SLURM_JOB_ID": "1", "SLURM_GPUS_ON_NODE": "1"}
    env |= {"SLURM_JOB_NODELIST": "node[0-1]", "SLURM_NNODES": "2", "SLURM_NTASKS": "2"}
    done = subprocess.run(
        ["bash", str(CLUSTERS / script)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("script", ["slurm_torchrun.sbatch", "slurm_srun.sbatch"])
def test_the_sbatch_scripts_give_the_unsharded_loss(script, tmp_path):
    """slurm_torchrun.sbatch (a task a node, each a torchrun, NODE_RANK from SLURM_NODEID) and
    slurm_srun.sbatch (a task a rank, no torchrun: slurm_task.sh makes torch's environment from SLURM's)."""
    losses = _losses([_sbatch(script, tmp_path)])
    assert len(losses) == 2, losses
    expected = _unsharded_loss()
    assert all(abs(loss - expected) <= 1e-5 * abs(expected) + 1e-6 for loss in losses), (losses, expected)
