"""Train a Llama with Ray Train's ``TorchTrainer``, ``shardcore.optimize`` inside ``train_loop_per_worker``.

    python examples/ray_train.py --workers 4 --tp 2 --out /shared/runs

Ray starts the workers and their process group (gloo on CPUs, NCCL on GPUs) before the loop runs;
shardcore shards on that group as it does under torchrun. Each data-parallel rank trains on its part of
the global batch, so the loop is the unsharded loop on the whole batch (``--unsharded``). The checkpoint
is shardcore's distributed one, written by every worker into one directory on storage they share (one
node's disk, or a network filesystem), reported by rank 0 and read back by every worker of the next run
(``ray.train.get_checkpoint``), at any layout.

What a Ray user must not do: call ``torch.distributed.init_process_group`` in the loop (Ray did; a
second world would be a second set of groups), build a ``DeviceMesh`` per worker by hand (let shardcore
build its layout's once, or pass one mesh built on every worker alike as ``device_mesh=``), or seed the
workers differently before ``optimize`` (every rank must start from the same weights: shardcore checks).
Returns the losses of the global batch and the sum of the unsharded parameters' absolute values after
training (after loading, with ``--resume``).
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)  # every worker starts from the same weights
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def _batch() -> dict:
    ids = torch.randint(1, 256, (8, 16), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}  # the global batch, the same on every worker


def _unsharded(steps: int) -> list[float]:
    model, losses = _model(), []
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = model(**_batch()).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


# --8<-- [start:loop]
def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import torch.distributed as dist

    fsdp = "fsdp" if dist.get_world_size() > config["tp"] else None  # Ray started the group: shard on it
    model = shardcore.optimize(_model(), shardcore.ShardConfig(tensor_parallel_size=config["tp"], data_parallel=fsdp))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint = ray.train.get_checkpoint() or config.get("resume")  # this run's latest (restarted), or one given
    if checkpoint is not None:  # every worker reads its slices
        with checkpoint.as_directory() as path:
            shardcore.load_distributed(model, path, opt)
    layout, losses = model.shardcore.layout, []
    dp_rank = layout.coordinates(dist.get_rank())["dp"]
    for _ in range(config["steps"]):
        part = {k: v.chunk(layout.dp)[dp_rank] for k, v in _batch().items()}
        loss = model(**part).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        whole = loss.detach().clone()
        dist.all_reduce(whole)  # the global batch's loss: the mean over the parts (tp ranks hold the same)
        losses.append(whole.item() / dist.get_world_size())
    path = os.path.join(config["out"], f"checkpoint-{config['run']}")  # storage every worker shares
    shardcore.save_distributed(model, path, opt)  # every worker writes its slices; complete when it returns
    weights = sum(t.abs().sum().item() for _, t in shardcore.full_named_tensors(model))
    report = ray.train.Checkpoint.from_directory(path) if dist.get_rank() == 0 else None
    ray.train.report({"losses": losses, "weights": weights}, checkpoint=report)
    # --8<-- [end:loop]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default="ray-runs", help="storage every worker shares (checkpoints, Ray's results)")
    parser.add_argument("--resume", action="store_true", help="a second run from the first run's checkpoint")
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)
    if args.unsharded:
        return {"losses": _unsharded(args.steps)}
    # --8<-- [start:trainer]
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out, gpu = os.path.abspath(args.out), torch.cuda.is_available()

    def trainer(config: dict, name: str) -> TorchTrainer:
        return TorchTrainer(
            train_loop_per_worker,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=gpu),
            torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
            run_config=RunConfig(storage_path=out, name=name),  # storage every worker shares
        )

    ray.init(num_cpus=args.workers, include_dashboard=False)
    try:
        config = {"tp": args.tp, "steps": args.steps, "out": out, "run": 0}
        first = trainer(config, "first").fit()
        # --8<-- [end:trainer]
        result = {"losses": first.metrics["losses"], "weights": first.metrics["weights"]}
        if args.resume:  # a new run from the first's checkpoint, no step: the weights it loaded
            again = trainer({**config, "steps": 0, "run": 1, "resume": first.checkpoint}, "resumed").fit()
            result["resumed_weights"] = again.metrics["weights"]
        return result
    finally:
        ray.shutdown()


if __name__ == "__main__":
    import json

    print(json.dumps(main()))  # the last line: what main returned
