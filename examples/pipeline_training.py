"""Train a Llama over pipeline stages x tensor parallelism, in a plain loop.

    torchrun --standalone --nproc_per_node 4 examples/pipeline_training.py

Two stages of two tensor-parallel ranks each, 1F1B with 4 microbatches. ``shardcore.pipeline_step``
runs the schedule over the whole batch (as the unsharded model would take it) and returns its loss
on every rank; the usual clipping line gives the whole model's norm across the stages.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    config._attn_implementation = "sdpa"
    # --8<-- [start:config]
    shard = shardcore.ShardConfig(  # 2 stages x TP=2 on 4 ranks
        tensor_parallel_size=2, pipeline_parallel_size=2, pipeline_schedule="1F1B", num_microbatches=4
    )
    # --8<-- [end:config]
    if args.unsharded:
        shard = shardcore.ShardConfig()
    ids = torch.randint(1, 256, (8, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    # --8<-- [start:loop]
    model = shardcore.optimize(LlamaForCausalLM(config), shard)  # this rank keeps its stage's layers
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # this rank's stage: its parameters only
    for _ in range(args.steps):
        # the whole batch on every rank, labels included, as the unsharded model takes it
        loss = shardcore.pipeline_step(model, {"input_ids": ids, "labels": ids})  # loss on every rank
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # over every stage's gradients
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # --8<-- [end:loop]
    if not dist.is_initialized() or dist.get_rank() == 0:
        print("losses", [round(x, 4) for x in losses])
    return losses


if __name__ == "__main__":
    main()
