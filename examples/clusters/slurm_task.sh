#!/usr/bin/env bash
# One SLURM task = one rank, no torchrun: the environment torch.distributed's env:// reads (RANK,
# WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), which shardcore.optimize initializes from, made
# from SLURM's. Run by examples/clusters/slurm_srun.sbatch as `srun bash examples/clusters/slurm_task.sh SCRIPT`.
set -euo pipefail
export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID
export LOCAL_WORLD_SIZE=${SLURM_NTASKS_PER_NODE:-$SLURM_NTASKS}
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
export MASTER_PORT=${MASTER_PORT:-29500}
exec "${PYTHON:-python}" "$@"
