"""Train a Llama with FSDP2 over two tensor-parallel groups, in a plain loop.

    torchrun --standalone --nproc_per_node 4 examples/fsdp_tp_training.py

Two TP=2 groups, FSDP over the two (the mesh's ``dp`` dim): each parameter, already a tensor-parallel
slice, is split again over ``dp``. Each data-parallel rank trains on its part of the global batch;
the gradients are averaged over ``dp``, so with equal parts the loop is the unsharded loop on the
whole batch (``--unsharded`` runs that, in one process, for comparison). Returns the losses of the
global batch.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)

    torch.manual_seed(0)  # every rank starts from the same weights
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    ids = torch.randint(1, 256, (8, 16), generator=torch.Generator().manual_seed(1))
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
    config = shardcore.ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="fsdp")
    model = shardcore.optimize(model, config)
    layout = model.shardcore.layout
    dp_rank = layout.coordinates(dist.get_rank())["dp"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = shardcore.StepMetrics(model, log_every=1, total=len(loader))  # tokens/s, MFU, memory; a progress bar
    for batch in loader:  # the global batch; each data-parallel rank trains on its part
        part = {k: v.chunk(layout.dp)[dp_rank] for k, v in batch.items()}
        loss = model(**part).loss
        loss.backward()  # gradients averaged over dp: the full batch's when the parts are equal
        opt.step()
        opt.zero_grad()
        metrics.step(loss, tokens=part["input_ids"].numel())  # no host sync but at a log step
        # --8<-- [end:loop]
        whole = loss.detach().clone()
        dist.all_reduce(whole)  # this step's loss on the global batch: the mean over the dp ranks' parts
        losses.append(whole.item() / dist.get_world_size())  # (the tp ranks of a part hold the same loss)
    metrics.close()
    if dist.get_rank() == 0:
        print("losses", [round(x, 4) for x in losses])
    return losses


if __name__ == "__main__":
    main()
