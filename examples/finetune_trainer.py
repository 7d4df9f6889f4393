"""Fine-tune a Llama with the HuggingFace Trainer, tensor parallel x data parallel.

    torchrun --standalone --nproc_per_node 4 examples/finetune_trainer.py --tp 2 --out /tmp/ft

The one changed line against a plain HF script is the Trainer's import. Batches go to the
data-parallel replicas only (the tensor-parallel ranks of a replica see the same ones), the
gradient norm is the unsharded model's, and the checkpoints are complete HF checkpoints.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

import shardcore
from shardcore.hf import Trainer  # instead of: from transformers import Trainer


class Tokens(torch.utils.data.Dataset):
    """Random token sequences (a real script would tokenize a corpus here)."""

    def __init__(self, n: int = 32, seq: int = 16, vocab: int = 256) -> None:
        self.ids = torch.randint(1, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="/tmp/shardcore-finetune")
    args = parser.parse_args(argv)

    torch.manual_seed(0)  # every rank builds the same model
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    # --8<-- [start:optimize]
    model = shardcore.optimize(
        LlamaForCausalLM(config),
        shardcore.ShardConfig(tensor_parallel_size=args.tp, data_parallel="ddp"),  # dp = the ranks left
    )
    # --8<-- [end:optimize]
    training = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=args.steps,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.steps,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    # --8<-- [start:train]
    trainer = Trainer(model=model, args=training, train_dataset=Tokens())  # shardcore.hf.Trainer
    trainer.train()
    # --8<-- [end:train]
    # the checkpoint is the unsharded model: any process can load it without shardcore
    reloaded = LlamaForCausalLM.from_pretrained(f"{args.out}/checkpoint-{args.steps}")
    print(f"reloaded {sum(p.numel() for p in reloaded.parameters())} parameters unsharded")
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


if __name__ == "__main__":
    main()
