"""LoRA fine-tuning of a tensor-parallel Llama with PEFT, in a plain training loop.

    torchrun --standalone --nproc_per_node 2 examples/lora_finetune.py --out /tmp/lora

``optimize`` first, then ``peft.get_peft_model`` (the other order works too): the adapters are
sharded the Megatron way beside the parallel layers, only they train, the gradient clipping line
is the usual one, and the adapter saved here loads onto the unsharded base model.
"""

from __future__ import annotations

import argparse

import peft
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="/tmp/shardcore-lora")
    args = parser.parse_args(argv)

    torch.manual_seed(0)  # every rank builds the same model and the same adapters
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    # --8<-- [start:lora]
    model = shardcore.optimize(LlamaForCausalLM(config), shardcore.ShardConfig(tensor_parallel_size=args.tp))
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    model = peft.get_peft_model(model, lora)  # or: shardcore.optimize(peft.get_peft_model(model, lora), config)
    # --8<-- [end:lora]

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(1, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    losses, norms = [], []
    for _ in range(args.steps):
        loss = model(input_ids=ids, labels=ids).loss
        # --8<-- [start:clip]
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the unsharded model's norm
        optimizer.step()
        # --8<-- [end:clip]
        norms.append(norm.item())
        optimizer.zero_grad()
        losses.append(loss.item())
    rank = dist.get_rank() if dist.is_initialized() else 0
    model.save_pretrained(f"{args.out}/adapter", is_main_process=rank == 0)  # every rank: adapters gathered
    model.merge_and_unload().save_pretrained(f"{args.out}/merged")  # the unsharded merged model
    if rank == 0:
        print("losses", [round(x, 4) for x in losses], "gradient norms", [round(x, 4) for x in norms])
    return losses


if __name__ == "__main__":
    main()
