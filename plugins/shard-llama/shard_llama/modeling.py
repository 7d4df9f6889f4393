"""What a Llama-architecture model sharded with ``parallel_output=True`` says when asked to generate."""

from __future__ import annotations


def generate_needs_full_logits(*args, **kwargs):
    raise RuntimeError(
        "generate() needs full-vocabulary logits, but this model was sharded with "
        "ShardConfig(parallel_output=True), which keeps them split over the ranks; "
        "shard with parallel_output=False (the default) to generate."
    )
