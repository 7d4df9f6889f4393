"""``torch.compile`` of a tensor-parallel block is one graph: the mappings' collectives are graph
ops (torch's functional collectives, :mod:`shardcore.distributed.traced`), not graph breaks, and
the compiled block computes what the eager one does, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from toy_models import ToyLM, ToyPolicy

import shardcore
from shardcore import ShardConfig
from shardcore.testing import run_on_ranks


def _recording_backend(seen: dict):
    """aot_eager that lists the collectives in the forward and the backward graphs it is handed."""
    from torch._dynamo.backends.common import aot_autograd

    def record(kind):
        def compiler(gm, inputs):
            seen[kind] += [str(n.target) for n in gm.graph.nodes if "c10d_functional" in str(n.target)]
            seen[kind] = [t for t in seen[kind] if "wait_tensor" not in t]
            return gm.forward

        return compiler

    return aot_autograd(fw_compiler=record("forward"), bw_compiler=record("backward"))


def _sharded() -> ToyLM:
    torch.manual_seed(0)
    return shardcore.optimize(
        ToyLM(vocab=128), ShardConfig(tensor_parallel_size=dist.get_world_size()), policy=ToyPolicy
    )


def _compiled_block() -> dict:
    eager, block = (_sharded().blocks[0] for _ in range(2))  # the same shards: one run eagerly, one compiled
    seen = {"forward": [], "backward": []}
    torch._dynamo.reset()
    compiled = torch.compile(block, backend=_recording_backend(seen), fullgraph=True)  # a graph break raises
    torch.manual_seed(1)
    x = torch.randn(2, 8, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    want, got = eager(x), compiled(x2)
    (want * torch.arange(64.0)).sum().backward()
    (got * torch.arange(64.0)).sum().backward()
    errors = {"output": (got - want).abs().max().item(), "input grad": (x2.grad - x.grad).abs().max().item()}
    for (name, p), q in zip(eager.named_parameters(), block.parameters(), strict=True):
        errors[name] = (p.grad - q.grad).abs().max().item()
    return {"errors": errors, "seen": seen}


@pytest.mark.parametrize("world", [2])
def test_a_compiled_tensor_parallel_block_is_one_graph_with_its_collectives_in_it(world):
    for result in run_on_ranks(world, _compiled_block):
        errors = result["errors"]
        assert errors["output"] < 1e-5, f"the compiled block's output differs from the eager one's: {errors}"
        assert max(errors.values()) < 1e-5, f"the compiled block's gradients differ from the eager one's: {errors}"
        reduces = [t for t in result["seen"]["forward"] if "all_reduce" in t]
        assert len(reduces) == 2, f"the forward graph should hold the two row-parallel all-reduces: {result['seen']}"
        grads = [t for t in result["seen"]["backward"] if "all_reduce" in t]
        assert len(grads) == 2, f"the backward graph should hold the two column inputs' all-reduces: {result['seen']}"
