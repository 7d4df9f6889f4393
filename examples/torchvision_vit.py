"""A model from neither transformers nor timm: torchvision's Vision Transformer, sharded by ``plan="derive"``.

    torchrun --standalone --nproc_per_node 2 examples/torchvision_vit.py --tp 2

torchvision's ``VisionTransformer`` (the class behind ``vit_b_16``) keeps its blocks in an
``nn.Sequential`` and its attention in ``nn.MultiheadAttention``. ``plan="derive"`` reads its blocks
and splits each ``MLPBlock`` column then row; the attention stays whole (its forward reads the packed
``in_proj_weight`` itself, which no plan can split: a policy could). The checks at ``optimize`` run
the model on an image of its ``image_size`` and compare a block and the output with the unsharded
ones. A test runs this file on 2 and 4 gloo ranks against the unsharded model. (``--size b16`` is
``vit_b_16``'s shape, 86M parameters, random weights: nothing is downloaded.)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def build(size: str = "tiny"):
    from torchvision.models.vision_transformer import VisionTransformer

    shape = {
        "tiny": dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128),
        "b16": dict(image_size=224, patch_size=16, num_layers=12, num_heads=12, hidden_dim=768, mlp_dim=3072),
    }[size]
    model = VisionTransformer(**shape, num_classes=10)
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts the head at zero
    return model


def batch(size: str = "tiny") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    pixels = 32 if size == "tiny" else 224
    return torch.randn(4, 3, pixels, pixels, generator=g), torch.randint(0, 10, (4,), generator=g)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--size", choices=["tiny", "b16"], default="tiny")
    parser.add_argument("--unsharded", action="store_true", help="the same loop on the plain model")
    args = parser.parse_args(argv)

    # --8<-- [start:shard]
    import shardcore

    torch.manual_seed(0)  # every rank starts from the same weights
    model = build(args.size)
    if not args.unsharded:
        model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=args.tp, plan="derive"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, labels = batch(args.size)
    losses = []
    for _ in range(args.steps):
        loss = F.cross_entropy(model(images), labels)  # (4, 10) logits on every rank
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # --8<-- [end:shard]
    return {"losses": losses}


if __name__ == "__main__":
    print(main())
