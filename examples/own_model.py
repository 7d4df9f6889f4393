"""Your own model, sharded by a YAML plan: a nanoGPT-shaped model of plain ``torch.nn`` modules.

    torchrun --standalone --nproc_per_node 2 examples/own_model.py --tp 2

``NanoLM`` is what a researcher writes: an embedding, blocks ``x + down(gelu(up(norm(x))))``, a final
norm and a linear head; ``forward(input_ids) -> logits``. ``own_model.yaml`` splits its embedding and
head over the vocabulary and its MLPs column then row. The sharded model returns the unsharded
model's logits (the whole vocabulary) and the user's own ``F.cross_entropy`` on them gives the
unsharded loss; a test runs this file on 2 and 4 gloo ranks against the unsharded model.
"""

from __future__ import annotations

import argparse
import pathlib

import torch
import torch.nn.functional as F
from torch import nn

PLAN = pathlib.Path(__file__).resolve().with_name("own_model.yaml")


# --8<-- [start:model]
class MLP(nn.Module):
    def __init__(self, dim: int, inner: int, *, stat_norm: bool = False, scalar: bool = False) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, inner), nn.Linear(inner, dim)
        # variants the tests shard with the same plan: a norm over the split width (refused by name),
        # a learnable scale inside the split region that no plan names (its gradient summed)
        self.norm = nn.LayerNorm(inner, elementwise_affine=False) if stat_norm else nn.Identity()
        self.scale = nn.Parameter(torch.tensor(1.5)) if scalar else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.up(x))
        if self.scale is not None:
            h = h * self.scale
        return self.down(self.norm(h))


class Block(nn.Module):
    def __init__(self, dim: int, inner: int, **variant) -> None:
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(dim), MLP(dim, inner, **variant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class NanoLM(nn.Module):
    def __init__(self, vocab: int = 212, dim: int = 48, inner: int = 96, layers: int = 2, **variant) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, inner, **variant) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# --8<-- [end:model]


def batch(vocab: int = 212) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (3, 11), generator=g), torch.randint(0, vocab, (3, 11), generator=g)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=212)
    parser.add_argument("--unsharded", action="store_true", help="the same loop on the plain model")
    parser.add_argument("--parallel-output", action="store_true", help="each rank keeps its vocabulary slice")
    args = parser.parse_args(argv)
    if args.parallel_output:
        return train_on_slices(args.tp, args.steps, args.vocab)

    # --8<-- [start:shard]
    import shardcore

    torch.manual_seed(0)  # every rank starts from the same weights
    model = NanoLM(vocab=args.vocab)
    if not args.unsharded:
        model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=args.tp, plan=PLAN))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids, targets = batch(args.vocab)
    losses = []
    for _ in range(args.steps):
        logits = model(ids)  # (3, 11, vocab): the whole vocabulary on every rank
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # the user's own loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # --8<-- [end:shard]
    return {"losses": losses, "logits_shape": tuple(logits.shape)}


def train_on_slices(tp: int, steps: int, vocab: int) -> dict:
    # --8<-- [start:slices]
    import shardcore

    torch.manual_seed(0)
    config = shardcore.ShardConfig(tensor_parallel_size=tp, plan=PLAN, parallel_output=True)
    model = shardcore.optimize(NanoLM(vocab=vocab), config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids, targets = batch(vocab)
    losses = []
    for _ in range(steps):
        logits = model(ids)  # this rank's columns of the vocabulary only: F.cross_entropy on them raises
        loss = shardcore.vocab_parallel_cross_entropy(logits.flatten(0, 1), targets.flatten())  # the whole loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    whole = shardcore.tensor_parallel.gather_vocab(logits)  # every rank: the whole logits, for a metric
    # --8<-- [end:slices]
    return {"losses": losses, "logits_shape": tuple(whole.shape), "slice_width": logits.shape[-1]}


if __name__ == "__main__":
    print(main())
