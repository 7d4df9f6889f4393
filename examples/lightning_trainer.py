"""Train a Llama with the Lightning Trainer's ``ModelParallelStrategy``, shardcore in ``configure_model``.

    torchrun --standalone --nproc_per_node 4 examples/lightning_trainer.py --tp 2 --dp 2

The strategy builds the mesh ``("data_parallel", "tensor_parallel")`` and gives it to the module as
``self.device_mesh``; ``configure_model`` shards the model on it (``ShardConfig(device_mesh=...)``).
The Trainer's sampler splits the global batch over ``data_parallel`` alone, so the loop is the
unsharded loop on the whole batch (``--unsharded``). The Trainer's own checkpoints go through
``torch.distributed.checkpoint``'s state-dict API, which shardcore refuses on a sharded model (it
would keep one rank's slices): they are off here, and ``on_train_end`` saves with
``shardcore.save_distributed`` instead. Returns the losses of the global batch.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import shardcore


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)  # every rank starts from the same weights
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def _rows(steps: int) -> list[dict]:
    ids = torch.randint(1, 256, (8, 16), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]  # the global batch, 8 rows


def _unsharded(steps: int) -> list[float]:
    model, losses = _model(), []
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = {k: torch.stack([r[k] for r in _rows(steps)]) for k in ("input_ids", "labels")}
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--checkpoint", default=None, help="a directory shardcore.save_distributed writes at the end")
    parser.add_argument("--unsharded", action="store_true", help="the same loop in one process, for comparison")
    args = parser.parse_args(argv)
    if args.unsharded:
        return _unsharded(args.steps)
    # --8<-- [start:trainer]
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import ModelParallelStrategy

    class Llama(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model, self.losses = _model(), []

        def configure_model(self):  # self.device_mesh: the strategy's ("data_parallel", "tensor_parallel")
            fsdp = "fsdp" if self.device_mesh["data_parallel"].size() > 1 else None
            config = shardcore.ShardConfig(device_mesh=self.device_mesh, data_parallel=fsdp)
            self.model = shardcore.optimize(self.model, config)

        def training_step(self, batch, index):
            loss = self.model(**batch).loss
            self.losses.append(self.trainer.strategy.reduce(loss.detach(), reduce_op="mean").item())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.model.parameters(), lr=1e-3)

        def on_train_end(self):  # the Trainer's checkpoints are off: shardcore's distributed checkpoint
            if args.checkpoint:
                shardcore.save_distributed(self.model, args.checkpoint, self.trainer.optimizers[0])

    strategy = ModelParallelStrategy(data_parallel_size=args.dp, tensor_parallel_size=args.tp)
    trainer = pl.Trainer(accelerator="cpu", devices=args.dp * args.tp, strategy=strategy, max_steps=args.steps,
                         enable_checkpointing=False, logger=False, enable_progress_bar=False)  # fmt: skip
    loader = torch.utils.data.DataLoader(_rows(args.steps), batch_size=8 // args.dp)  # split over data_parallel
    module = Llama()
    trainer.fit(module, loader)
    # --8<-- [end:trainer]
    return module.losses


if __name__ == "__main__":
    main()
