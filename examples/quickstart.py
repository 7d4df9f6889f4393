"""The README's example: a Llama sharded over 2 ranks gives the unsharded model's loss and tokens.

    torchrun --standalone --nproc_per_node 2 examples/quickstart.py

The lines between the ``readme`` markers are the README's example, verbatim (a test checks it, and
runs this file on 2 gloo ranks against the unsharded model).
"""

from __future__ import annotations


def main(argv: list[str] | None = None):
    # --8<-- [start:readme]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import shardcore

    torch.manual_seed(0)  # every rank starts from the same weights
    cfg = dict(hidden_size=256, intermediate_size=688, num_attention_heads=8, num_hidden_layers=4, vocab_size=1001)
    model = shardcore.optimize(LlamaForCausalLM(LlamaConfig(**cfg)), shardcore.ShardConfig(tensor_parallel_size=2))

    ids = torch.randint(0, 1001, (4, 128))
    loss = model(input_ids=ids, labels=ids).loss  # the unsharded model's loss
    loss.backward()  # each rank holds the gradient of its slice
    tokens = model.generate(ids[:, :8], max_new_tokens=16, do_sample=False)  # the unsharded tokens
    # --8<-- [end:readme]
    return loss.item(), tokens


if __name__ == "__main__":
    loss, tokens = main()
    print(f"loss {loss:.6f}, tokens {tokens[0].tolist()}")
