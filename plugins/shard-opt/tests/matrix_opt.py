"""The OPT row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny causal LM, 4 layers, learned positions."""

from opt_cases import VOCAB, build

from shardcore.testing import token_batch

CASES = {
    "opt": {
        "build": lambda: build(num_hidden_layers=4),
        "batch": lambda rows: token_batch(VOCAB, rows),
        "kit": {"zero_grads": ("*.self_attn.k_proj.bias",)},  # softmax ignores a shift of every key
    }
}
