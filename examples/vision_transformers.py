"""Vision transformers from timm and from HuggingFace, tensor parallel.

    pip install ./ './plugins/shard-vit[timm,hf]'
    torchrun --standalone --nproc_per_node 2 examples/vision_transformers.py

timm's attention packs q, k and v into one ``qkv`` Linear; shard-vit splits it per head, so each
rank holds its heads' rows of q, of k and of v. Returns timm's logits and the HuggingFace model's
loss (``plugins/shard-vit/tests/test_vit_examples.py`` compares both with the unsharded models).
"""

from __future__ import annotations

import argparse

import timm
import torch
from transformers import ViTConfig, ViTForImageClassification

import shardcore


def main(argv: list[str] | None = None) -> tuple[torch.Tensor, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--unsharded", action="store_true", help="the same models, not sharded, for comparison")
    args = parser.parse_args(argv)
    tp = 1 if args.unsharded else args.tp
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))

    # --8<-- [start:vit]
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False)  # 6 heads: TP=2, 3 or 6
    model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=tp))
    logits = model(images)  # the unsharded logits

    torch.manual_seed(0)
    hf = ViTForImageClassification(ViTConfig(num_labels=10))  # 12 heads
    hf = shardcore.optimize(hf, shardcore.ShardConfig(tensor_parallel_size=tp))
    loss = hf(pixel_values=images, labels=torch.tensor([1, 7])).loss
    # --8<-- [end:vit]
    return logits.detach(), loss.item()


if __name__ == "__main__":
    print(main())
