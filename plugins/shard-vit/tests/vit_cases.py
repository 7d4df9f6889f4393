"""Tiny HF ViT / DeiT and timm ViT models and image batches for shard-vit's tests (fp32, dropout 0).

Nothing here imports transformers or timm at module level (the timm-only test relies on it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IMAGE = 32


def hf_build(
    cls_name: str,
    *,
    heads: int = 4,
    hidden: int = 64,
    intermediate: int = 128,
    layers: int = 2,
    image: int = IMAGE,
    **extra,
):
    import transformers

    config_cls = transformers.DeiTConfig if cls_name.startswith("DeiT") else transformers.ViTConfig
    config = config_cls(
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        image_size=image,
        patch_size=8,
        num_channels=3,
        num_labels=3,
        encoder_stride=8,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.1,  # 5x the default: attention far from uniform, every gradient testable
        **extra,
    )
    config._attn_implementation = "sdpa"
    model = getattr(transformers, cls_name)(config).float()
    # DeiT starts its class/distillation tokens and position embeddings at zero: the first
    # LayerNorm then sees a constant vector (variance 0, amplification 1/sqrt(eps) = 1e6) and the
    # gradients of these tokens are ill-conditioned, sharded or not. Give them trained-like values.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("cls_token", "distillation_token", "position_embeddings", "mask_token")):
                param.normal_(std=0.02)
    return model


def hf_batch(cls_name: str, seed: int = 1, image: int = IMAGE) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {"pixel_values": torch.randn(2, 3, image, image, generator=g)}
    if cls_name.endswith("ImageClassification"):
        out["labels"] = torch.tensor([2, 0])
    if cls_name.endswith("MaskedImageModeling"):
        out["bool_masked_pos"] = torch.rand(2, (image // 8) ** 2, generator=g) < 0.5
    return out


def timm_build(name: str, **kwargs):
    import timm

    if name.startswith(("vit_", "deit_")):
        kwargs.setdefault("img_size", IMAGE)
    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs).float()


def timm_batch(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(2, 3, IMAGE, IMAGE, generator=g)}


def timm_loss(logits: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, torch.tensor([3, 7]))
