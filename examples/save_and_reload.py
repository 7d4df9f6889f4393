"""Save a sharded model with HuggingFace's own call and reload it anywhere, unsharded or sharded.

    torchrun --standalone --nproc_per_node 2 examples/save_and_reload.py --out /tmp/ckpt

``model.save_pretrained`` on every rank writes the complete checkpoint (gathered tensor by
tensor); ``from_pretrained`` reads it back without shardcore. ``shardcore.save_checkpoint`` writes
the same files; ``shardcore.load_checkpoint`` reads them into a model built on the meta device
(``shardcore.init_empty``) and sharded before any weight exists, each rank reading only its slices.
Returns the largest logit difference of each reloaded model against the one that was saved.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> list[float]:
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
    reloaded = []

    # --8<-- [start:save_pretrained]
    model.save_pretrained(args.out, is_main_process=(rank == 0))  # on every rank; the flag is optional
    unsharded = LlamaForCausalLM.from_pretrained(args.out)  # unsharded, same outputs; no shardcore needed
    # --8<-- [end:save_pretrained]
    reloaded.append(unsharded)

    # --8<-- [start:save_checkpoint]
    shardcore.save_checkpoint(model, f"{args.out}/own")  # every rank calls; the first one writes
    unsharded = AutoModelForCausalLM.from_pretrained(f"{args.out}/own")  # full, unpadded tensors, original names
    # --8<-- [end:save_checkpoint]
    reloaded.append(unsharded)

    # --8<-- [start:load_checkpoint]
    with shardcore.init_empty():
        lazy = LlamaForCausalLM(config)  # parameters on meta: no memory; buffers computed as usual
    lazy = shardcore.optimize(lazy, shardcore.ShardConfig(tensor_parallel_size=args.tp))
    shardcore.load_checkpoint(lazy, args.out)  # model.safetensors or sharded files + index: this rank's slices
    # --8<-- [end:load_checkpoint]
    reloaded.append(lazy)

    with torch.no_grad():
        diffs = [(m(input_ids=ids).logits - logits).abs().max().item() for m in reloaded]
    if rank == 0:
        print("max logit difference: from_pretrained, save_checkpoint + from_pretrained, load_checkpoint:", diffs)
    return diffs


if __name__ == "__main__":
    main()
