"""Generate with a model sharded over worker processes, from a plain Python process (no torchrun).

    python examples/inference_parallelize.py [--world-size 2] [--checkpoint DIR]

``shardcore.parallelize`` starts the workers, each reads only its slices of the checkpoint, and
returns a handle called like the model. Without ``--checkpoint`` a tiny random Llama is written
first, so the script runs anywhere.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def main(argv: list[str] | None = None) -> list[list[int]]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--checkpoint", default=None)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint
        if path is None:
            torch.manual_seed(0)
            config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
            LlamaForCausalLM(config).save_pretrained(tmp)
            path = tmp
        ids = torch.randint(1, 256, (2, 8), generator=torch.Generator().manual_seed(1))
        # --8<-- [start:parallelize]
        # a save_pretrained directory (or a model object); the ranks run in processes of their own
        with shardcore.parallelize(path, world_size=args.world_size) as model:
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
        # --8<-- [end:parallelize]
    print("generated", tokens.tolist())
    return tokens.tolist()


if __name__ == "__main__":
    main()
