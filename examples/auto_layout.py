"""Let shardcore choose the layout: ``ShardConfig(auto=...)`` picks dp x pp x sp x tp for the job.

    shardcore calibrate --world 2 4          # once per machine, outside any job
    torchrun --standalone --nproc_per_node 4 examples/auto_layout.py

Rank 0 ranks every layout of the job's ranks by the cost model over this machine's profile (what
``shardcore explain MODEL --auto --world 4 --seq 32 --batch 8`` prints) and sends its choice to every
rank. The loop runs whichever it is: each data-parallel rank trains on its part of the global batch,
``shardcore.pipeline_step`` runs the forward and backward (through the schedule when the choice
has pipeline stages). ``--unsharded`` runs the plain loop in one process, for comparison. Returns
the chosen layout's name and the losses of the global batch.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> tuple[str, list[float]]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--profile", default=None, help="a profile from `shardcore calibrate --out` (default: cached)")
    parser.add_argument("--memory-gb", type=float, default=None, help="what a rank may hold (default: the profile's)")
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)

    torch.manual_seed(0)  # every rank starts from the same weights
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4)  # fmt: skip
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    ids = torch.randint(1, 256, (8, 32), generator=torch.Generator().manual_seed(1))
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
        return "unsharded", losses
    # --8<-- [start:auto]
    auto = shardcore.AutoLayout(seq=32, batch=8, memory_gb=args.memory_gb, profile=args.profile)
    model = shardcore.optimize(model, shardcore.ShardConfig(auto=auto))  # logs the choice once
    chosen = model.shardcore.auto  # name, predicted step_s and memory_bytes, the config fields it set
    layout = model.shardcore.layout
    dp_rank = layout.coordinates(dist.get_rank())["dp"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for batch in loader:  # the global batch; each data-parallel rank trains on its part
        part = {k: v.chunk(layout.dp)[dp_rank] for k, v in batch.items()}
        loss = shardcore.pipeline_step(model, part)  # forward + backward, whatever the layout
        opt.step()
        opt.zero_grad()
        # --8<-- [end:auto]
        whole = loss.detach().clone()
        dist.all_reduce(whole)  # the global batch's loss: the mean over the data-parallel parts
        losses.append(whole.item() / dist.get_world_size())  # (every rank of a part holds its loss)
    if dist.get_rank() == 0:
        print(f"chose {chosen['name']} ({chosen['config']}): losses", [round(x, 4) for x in losses])
    return chosen["name"], losses


if __name__ == "__main__":
    main()
