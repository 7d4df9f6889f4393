"""The Llama row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny causal LM, 4 layers, grouped queries."""

from llama_cases import build

from shardcore.testing import token_batch

CASES = {
    "llama": {
        "build": lambda: build("LlamaForCausalLM", layers=4, kv=2),
        "batch": lambda rows: token_batch(128, rows),
    }
}
