"""Train a Llama with Lightning Fabric's ``ModelParallelStrategy``, shardcore as its ``parallelize_fn``.

    torchrun --standalone --nproc_per_node 4 examples/lightning_fabric.py --tp 2 --dp 2

Lightning builds the device mesh ``("data_parallel", "tensor_parallel")`` and hands it to the
``parallelize_fn``; shardcore runs on that mesh (``ShardConfig(device_mesh=...)``: its groups, no second
set), tensor parallelism over ``tensor_parallel`` and FSDP2 over ``data_parallel``. Each data-parallel
rank trains on its part of the global batch, so the loop is the unsharded loop on the whole batch
(``--unsharded`` runs that in one process). Checkpoints: ``shardcore.save_distributed`` /
``load_distributed`` (``fabric.save`` stores a state dict that holds each rank's slices under the
unsharded names, which its distributed checkpoint would keep one of: shardcore refuses it by name).
Returns the losses of the global batch, then the largest difference of a reloaded parameter.
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
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--checkpoint", default=None, help="a directory: save, reload into a new model, compare")
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)
    ids = torch.randint(1, 256, (8, 16), generator=torch.Generator().manual_seed(1))
    loader = [{"input_ids": ids, "labels": ids}] * args.steps  # the global batch, the same on every rank
    if args.unsharded:
        return _unsharded(loader)
    # --8<-- [start:fabric]
    from lightning_fabric import Fabric
    from lightning_fabric.strategies import ModelParallelStrategy

    def parallelize(model, device_mesh):  # Lightning's mesh: ("data_parallel", "tensor_parallel")
        fsdp = "fsdp" if device_mesh["data_parallel"].size() > 1 else None
        return shardcore.optimize(model, shardcore.ShardConfig(device_mesh=device_mesh, data_parallel=fsdp))

    strategy = ModelParallelStrategy(
        parallelize_fn=parallelize, data_parallel_size=args.dp, tensor_parallel_size=args.tp
    )
    fabric = Fabric(accelerator="cpu", devices=args.dp * args.tp, strategy=strategy)
    fabric.launch()
    model = fabric.setup(_model())  # parallelize(model, mesh) runs here
    opt = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
    data_parallel = strategy.device_mesh["data_parallel"]
    losses = []
    for batch in loader:  # each data-parallel rank trains on its part of the global batch
        part = {k: v.chunk(data_parallel.size())[data_parallel.get_local_rank()] for k, v in batch.items()}
        loss = model(**part).loss
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(fabric.all_reduce(loss.detach(), reduce_op="mean").item())  # the global batch's loss
    # --8<-- [end:fabric]
    fabric.print("losses", [round(x, 4) for x in losses])
    if args.checkpoint is None:
        return losses
    # --8<-- [start:checkpoint]
    shardcore.save_distributed(model, args.checkpoint, opt)  # every rank: its slices, as pieces of the whole
    again = fabric.setup(_model())  # a new sharded model (or at another layout: it reshards)
    again_opt = fabric.setup_optimizers(torch.optim.AdamW(again.parameters(), lr=1e-3))
    shardcore.load_distributed(again, args.checkpoint, again_opt)
    # --8<-- [end:checkpoint]
    local = [
        (p.to_local() if hasattr(p, "to_local") else p).detach() for p in (*model.parameters(), *again.parameters())
    ]
    half = len(local) // 2
    return [*losses, max((a - b).abs().max().item() for a, b in zip(local[:half], local[half:], strict=True))]


if __name__ == "__main__":
    main()
