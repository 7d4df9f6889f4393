"""Before launching: will my layout compute the unsharded model's numbers? ``shardcore.check`` runs it
on local gloo processes beside the unsharded model and returns a card.

    python examples/check_layout.py                       # a tiny Llama at TP=2 and PP=2 x TP=2
    python examples/check_layout.py --model ./llama-70b   # a config directory: checked reduced

The same from the command line: ``shardcore check ./llama-70b --tp 2 --pp 2`` (``--json`` for CI).
Exits 1 if a card fails. Returns the cards.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import shardcore


def tiny_llama_dir(path: str) -> str:
    """A config directory of a tiny Llama (random weights are built from it: nothing downloaded)."""
    from transformers import LlamaConfig

    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}
    LlamaConfig(vocab_size=1001, num_key_value_heads=2, architectures=["LlamaForCausalLM"], **shape).save_pretrained(
        path
    )
    return path


def main(argv: list[str] | None = None) -> list:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="a directory with a config.json (default: a tiny Llama)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or tiny_llama_dir(tmp)
        # --8<-- [start:check]
        cards = []
        for layout in (
            shardcore.ShardConfig(tensor_parallel_size=2),
            shardcore.ShardConfig(tensor_parallel_size=2, pipeline_parallel_size=2),
        ):
            card = shardcore.check(model, layout, steps=2)  # 2 or 4 local processes, 2 AdamW steps
            print(card.format())  # the loss, every gradient by part, the clipped norm, the parameters
            cards.append(card)
        # --8<-- [end:check]
    return cards


if __name__ == "__main__":
    sys.exit(0 if all(card.passed for card in main()) else 1)
