"""The Llava row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny vision tower and language model."""

from llava_cases import batch_for, build

CASES = {
    "llava": {
        "kit": {"zero_grads": ("*.self_attn.k_proj.bias",)},
        "build": lambda: build(),
        "batch": lambda rows: batch_for(rows=rows),
    }
}
