"""Save a sharded model with HuggingFace's own call and reload it anywhere, unsharded or sharded.

    torchrun --standalone --nproc_per_node 2 examples/save_and_reload.py --out /tmp/ckpt

``model.save_pretrained`` on every rank writes the complete checkpoint (gathered tensor by
tensor); ``from_pretrained`` reads it back without shardcore, and ``shardcore.load_checkpoint``
reads it into a model sharded at another degree, each rank only its slices.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--out", default="/tmp/shardcore-ckpt")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = shardcore.optimize(LlamaForCausalLM(config), shardcore.ShardConfig(tensor_parallel_size=args.tp))
    ids = torch.randint(1, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(input_ids=ids).logits

    rank = dist.get_rank() if dist.is_initialized() else 0
    model.save_pretrained(args.out, is_main_process=rank == 0)  # on every rank, as HF scripts do

    unsharded = LlamaForCausalLM.from_pretrained(args.out)  # no shardcore needed to read it
    with torch.no_grad():
        diff = (unsharded(input_ids=ids).logits - logits).abs().max().item()
    if rank == 0:
        print(f"unsharded model from the checkpoint: max logit difference {diff:.2e}")
    return diff


if __name__ == "__main__":
    main()
