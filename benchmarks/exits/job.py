"""A short TP=2 job as a user writes one: forward, backward, clip, AdamW step, save_checkpoint, exit
(no teardown unless --teardown). Run N times in a row by benchmarks/exits/loop.sh."""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore

torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2, vocab_size=128)
model = shardcore.optimize(LlamaForCausalLM(cfg), shardcore.ShardConfig(tensor_parallel_size=2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 128, (2, 16))
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
opt.step()
out = os.environ.get("JOB_OUT", tempfile.mkdtemp())
shardcore.save_checkpoint(model, out)
print(f"rank {dist.get_rank()} done loss {loss.item():.4f}", flush=True)
if "--teardown" in sys.argv:
    dist.barrier()
    dist.destroy_process_group()
