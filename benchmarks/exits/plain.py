"""No shardcore: a gloo job whose last collectives are an all-gather (its Python tensors dropped) and a
barrier, then exit; --teardown adds destroy_process_group, as the issue's scripts did."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.randn(1000)
for _ in range(5):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    del parts
dist.barrier()
print(f"rank {dist.get_rank()} done", flush=True)
if "--teardown" in sys.argv:
    dist.destroy_process_group()
