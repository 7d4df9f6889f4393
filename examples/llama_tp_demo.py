"""Train a small Llama tensor-parallel over the ranks of torchrun, beside the unsharded model.

    torchrun --standalone --nproc_per_node 2 examples/llama_tp_demo.py [--steps 5]

Every rank builds the same model from one seed; one copy is sharded with ``shardcore.optimize``,
the other stays whole as the reference. Both train on the same byte-level text with AdamW, and
rank 0 prints, per step, both losses and the largest logit difference, then the parameter bytes
each rank holds against the unsharded model.
"""

from __future__ import annotations

import argparse
import inspect
import json

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def batches(batch: int, seq: int, steps: int):
    """Byte-level token windows from the docstrings of this Python's standard library."""
    import collections
    import json as json_mod
    import pathlib

    text = "\n".join(inspect.getdoc(m) or "" for m in (collections, json_mod, pathlib, argparse, inspect))
    data = torch.tensor(list(text.encode()), dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
        ids = torch.stack([data[s : s + seq] for s in starts])
        yield {"input_ids": ids, "labels": ids}


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--json", help="also write the results to this file (rank 0)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = LlamaConfig(
        vocab_size=259,  # bytes + 3 specials: not divisible by the TP size, padded invisibly
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    reference = LlamaForCausalLM(config)
    torch.manual_seed(0)
    model = shardcore.optimize(LlamaForCausalLM(config), shardcore.ShardConfig(tensor_parallel_size=world))

    opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows = []
    for step, batch in enumerate(batches(args.batch, args.seq, args.steps)):
        out_ref, out = reference(**batch), model(**batch)
        delta = (out.logits - out_ref.logits).abs().max().item()
        rows.append(
            {
                "step": step,
                "loss_unsharded": out_ref.loss.item(),
                "loss_sharded": out.loss.item(),
                "max_abs_dlogits": delta,
            }
        )
        for loss, opt_ in ((out_ref.loss, opt_ref), (out.loss, opt)):
            opt_.zero_grad()
            loss.backward()
            opt_.step()

    local = torch.tensor([param_bytes(model)])
    every = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(every, local)
    full = param_bytes(reference)
    if rank == 0:
        print(
            f"\nLlama ({config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}) "
            f"sharded over {world} gloo ranks (TP={world}) vs the unsharded model\n"
        )
        print(f"{'step':>4}  {'loss unsharded':>14}  {'loss sharded':>12}  {'max |Δ logits|':>14}")
        for r in rows:
            print(
                f"{r['step']:>4}  {r['loss_unsharded']:>14.6f}  {r['loss_sharded']:>12.6f}  {r['max_abs_dlogits']:>14.2e}"
            )
        print(f"\n{'rank':>4}  {'parameter bytes':>15}  {'vs unsharded':>12}")
        for r, b in enumerate(every):
            print(f"{r:>4}  {b.item():>15,}  {b.item() / full:>11.3f}x")
        print(f"{'all':>4}  {full:>15,}  {'(unsharded)':>12}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"steps": rows, "param_bytes": [b.item() for b in every], "param_bytes_unsharded": full},
                    f,
                    indent=2,
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
