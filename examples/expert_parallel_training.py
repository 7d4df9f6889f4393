"""Train a small Mixtral with its experts split over two data-parallel ranks, in a plain loop.

    torchrun --standalone --nproc_per_node 2 examples/expert_parallel_training.py

Expert parallelism over the two data-parallel ranks: each rank trains on its part of the global
batch and holds half of every layer's experts; the tokens travel to their experts' rank and back
by all-to-all; attention, the router and the embeddings stay DDP over the two. With
``global_batch_balance=True`` the router's load-balancing loss counts the whole global batch, so
the loop computes the unsharded loop's losses on the whole batch (``--unsharded`` runs that, in
one process, for comparison). Returns the losses of the global batch.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from transformers import MixtralConfig, MixtralForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)

    torch.manual_seed(0)  # every rank starts from the same weights
    config = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, output_router_logits=True)  # fmt: skip
    config._attn_implementation = "sdpa"
    model = MixtralForCausalLM(config)
    ids = torch.randint(1, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    loader = [{"input_ids": ids, "labels": ids}] * args.steps  # the global batch, the same on every rank
    losses = []
    if args.unsharded:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses
    # --8<-- [start:loop]
    config = shardcore.ShardConfig(
        tensor_parallel_size=1, expert_parallel_size=2, data_parallel="ddp", global_batch_balance=True
    )
    model = shardcore.optimize(model, config)
    layout = model.shardcore.layout
    dp_rank = layout.coordinates(dist.get_rank())["dp"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for batch in loader:  # the global batch; each data-parallel rank trains on its part
        part = {k: v.chunk(layout.dp)[dp_rank] for k, v in batch.items()}
        loss = model(**part).loss  # its tokens routed to the experts of both ranks and back
        loss.backward()  # dense gradients averaged by DDP, each expert's over the ranks' tokens
        opt.step()
        opt.zero_grad()
        # --8<-- [end:loop]
        whole = loss.detach().clone()
        dist.all_reduce(whole)  # this step's loss on the global batch: the mean over the ranks' parts
        losses.append(whole.item() / dist.get_world_size())
    if dist.get_rank() == 0:
        print("losses", [round(x, 4) for x in losses])
    return losses


if __name__ == "__main__":
    main()
