"""Train on long sequences with sequence parallelism over the tensor-parallel group.

    torchrun --standalone --nproc_per_node 2 examples/long_sequence_sp.py --seq 2048

Megatron's split_gather: between the blocks' tensor-parallel regions each rank holds its part of
the sequence, so activation memory per rank falls with the group size; the model's own forward
runs, and the loss, gradients and the clipping norm are the unsharded model's. HuggingFace's
gradient checkpointing is on (in both runs): each block recomputed in the backward runs split.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.seq)  # fmt: skip
    config._attn_implementation = "sdpa"
    # --8<-- [start:optimize]
    shard = shardcore.ShardConfig(
        tensor_parallel_size=2, enable_sequence_parallelism=True, sequence_parallelism_mode="split_gather"
    )  # or DeepSpeed-Ulysses: tensor_parallel_size=1, sequence_parallel_size=2, sequence_parallelism_mode="all_to_all"
    if args.unsharded:
        shard = shardcore.ShardConfig()
    model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable()  # optional: each recomputed block runs split, as its forward did
    model = shardcore.optimize(model, shard)  # same calls, same outputs: logits, loss, generate()
    # --8<-- [end:optimize]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(1, 256, (2, args.seq), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(args.steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    if not dist.is_initialized() or dist.get_rank() == 0:
        print("losses", [round(x, 4) for x in losses])
    return losses


if __name__ == "__main__":
    main()
