"""Train a Llama in an accelerate loop, shardcore sharding it on accelerate's mesh.

    torchrun --standalone --nproc_per_node 4 examples/accelerate_loop.py --tp 2 --dp 2

accelerate's ``ParallelismConfig`` builds the device mesh ``("dp_shard", "tp")``; shardcore runs on it
(``ShardConfig(device_mesh=...)``: its groups, tensor parallelism over ``tp``, FSDP2 over ``dp_shard``).
The loop is accelerate's own: ``accelerator.prepare``, ``accelerator.backward``,
``accelerator.clip_grad_norm_``, ``accelerator.reduce``. The model stays as shardcore returned it:
``accelerator.prepare(model)`` would wrap it in a DDP over every process, which is right for tensor
parallelism alone (``--prepare-model``; the slices are left alone) and refused by name otherwise (a
second data parallelism around shardcore's, or one that never averages the slices over the replicas). Each data-parallel rank trains on its part of the global batch, so the
loop is the unsharded loop on the whole batch (``--unsharded`` runs that in one process).
Returns the losses of the global batch.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)  # every rank starts from the same weights
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def _unsharded(loader: list[dict]) -> list[float]:
    model, losses = _model(), []
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prepare-model", action="store_true", help="accelerator.prepare(model, optimizer)")
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)
    ids = torch.randint(1, 256, (8, 16), generator=torch.Generator().manual_seed(1))
    loader = [{"input_ids": ids, "labels": ids}] * args.steps  # the global batch, the same on every rank
    if args.unsharded:
        return _unsharded(loader)
    # --8<-- [start:accelerate]
    from accelerate import Accelerator
    from accelerate.parallelism_config import ParallelismConfig

    accelerator = Accelerator(cpu=True)
    mesh = ParallelismConfig(dp_shard_size=args.dp, tp_size=args.tp).build_device_mesh("cpu")
    fsdp = "fsdp" if args.dp > 1 else None
    model = shardcore.optimize(_model(), shardcore.ShardConfig(device_mesh=mesh, data_parallel=fsdp))
    layout = model.shardcore.layout  # where this rank sits: its data-parallel part
    opt = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3))  # the model as shardcore made it
    # --8<-- [end:accelerate]
    if args.prepare_model:  # tensor parallelism alone: right (DDP leaves the slices alone); else refused by name
        model = accelerator.prepare(model)
    # --8<-- [start:loop]
    dp_rank = layout.coordinates(accelerator.process_index)["dp"]
    losses = []
    for batch in loader:  # each data-parallel rank trains on its part of the global batch
        part = {k: v.chunk(layout.dp)[dp_rank] for k, v in batch.items()}
        loss = model(**part).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())  # the global batch's loss
    # --8<-- [end:loop]
    accelerator.print("losses", [round(x, 4) for x in losses])
    return losses


if __name__ == "__main__":
    main()
