"""``shardcore.hf.Trainer`` surviving a killed process (run by ``torchrun --max-restarts 1``): a
checkpoint every step; a restarted job resumes from the newest complete one
(``resume_from_checkpoint=True`` passes over, and names, the checkpoint the crash interrupted).

    torchrun --standalone --nproc_per_node 2 --max-restarts 1 tests/integration/jobs/resume_trainer.py OUT [--crash-at 3]

``--crash-at K``: in the first attempt rank 1 is killed (SIGKILL) while step K's checkpoint is
written (after its weights, before its optimizer state). Rank 0 logs each step's loss to
``OUT/losses.jsonl``; the final weights go to ``OUT/final``."""

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
from shardcore.hf import Trainer

STEPS = 5


class _Log(transformers.TrainerCallback):
    def __init__(self, path: pathlib.Path, attempt: int) -> None:
        self.path, self.attempt = path, attempt

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": state.global_step, "loss": logs["loss"], "attempt": self.attempt}) + "\n")


def _data() -> list[dict]:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 128, (4 * STEPS, 16), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--crash-at", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    init_from_env()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = shardcore.optimize(transformers.LlamaForCausalLM(config), shardcore.ShardConfig(tensor_parallel_size=2))
    training = transformers.TrainingArguments(
        output_dir=str(out / "run"), per_device_train_batch_size=4, max_steps=STEPS, learning_rate=5e-3,
        max_grad_norm=0.5, logging_steps=1, save_strategy="steps", save_steps=1, report_to=[], use_cpu=True,
        seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(
        model=model, args=training, train_dataset=_data(), callbacks=[_Log(out / "losses.jsonl", attempt)]
    )
    if args.crash_at is not None and attempt == 0 and torch.distributed.get_rank() == 1:
        real = Trainer._save_optimizer_and_scheduler

        def dying(self, output_dir):
            if self.state.global_step == args.crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, output_dir)

        Trainer._save_optimizer_and_scheduler = dying
    resume = any((out / "run").glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)
    trainer.save_model(str(out / "final"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
