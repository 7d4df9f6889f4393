"""The mixture-of-experts rows of ``nox -s matrix`` (benchmarks/matrix.py): tiny Mixtral, Qwen2-MoE and
OLMoE causal LMs of 2 layers. Without the router's auxiliary loss (``output_router_logits=False``):
with it, pipelines and sequence splits are refused by name (its balance is over every layer's and
every token's routing at once)."""

from moe_cases import VOCAB, build

from shardcore.testing import token_batch

CASES = {
    family: {
        "build": lambda family=family: build(family, output_router_logits=False),
        "batch": lambda rows: token_batch(VOCAB, rows),
    }
    for family in ("mixtral", "qwen2_moe", "olmoe")
}
