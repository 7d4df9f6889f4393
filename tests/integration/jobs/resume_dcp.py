"""A training job that survives a killed process (run by ``torchrun --max-restarts 1``): each step
ends with a distributed checkpoint (``step-K``); a restarted job resumes from the newest complete one
(an interrupted one is refused by ``load_distributed`` and passed over) and trains on.

    torchrun --standalone --nproc_per_node 2 --max-restarts 1 tests/integration/jobs/resume_dcp.py OUT --steps 5 [--crash-at 3]

``--crash-at K``: in the first attempt, rank 1 is killed (SIGKILL) inside step K's checkpoint save,
after the step. Rank 0 logs each step's loss to ``OUT/losses.jsonl`` with the attempt's number; the
final weights are written to ``OUT/final`` (a HuggingFace checkpoint)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal

import torch
import transformers

import shardcore
from shardcore.distributed import init_from_env


def _batch(step: int) -> dict:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(1, 128, (4, 16), generator=g)
    return {"input_ids": ids, "labels": ids}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _resume(model, optimizer, out: pathlib.Path) -> int:
    """Load the newest complete checkpoint; the step to start at (0: none)."""
    steps = sorted((int(p.name.split("-")[1]) for p in out.glob("step-*")), reverse=True)
    for step in steps:
        try:
            shardcore.load_distributed(model, out / f"step-{step}", optimizer)
        except shardcore.CheckpointError as err:
            print(f"passing over step-{step}: {err}", flush=True)
            continue
        return step + 1
    return 0


def _crash_inside_the_next_save() -> None:
    import torch.distributed.checkpoint as dcp

    real = dcp.FileSystemWriter.write_data

    def dying(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *args, **kwargs)

    dcp.FileSystemWriter.write_data = dying


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--crash-at", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    init_from_env()
    rank, attempt = torch.distributed.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = shardcore.optimize(_model(), shardcore.ShardConfig(tensor_parallel_size=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = _resume(model, optimizer, out)
    for step in range(start, args.steps):
        loss = model(**_batch(step)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            with open(out / "losses.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "loss": loss.item(), "attempt": attempt, "start": start}) + "\n")
        if args.crash_at == step and attempt == 0 and rank == 1:
            _crash_inside_the_next_save()
        shardcore.save_distributed(model, out / f"step-{step}", optimizer)
    shardcore.save_checkpoint(model, out / "final")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
