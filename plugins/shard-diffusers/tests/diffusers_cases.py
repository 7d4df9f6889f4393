"""Tiny diffusion transformers: random weights, fp32, dropout 0 (the class-label dropout too)."""

from __future__ import annotations

import torch


def build(cls_name: str = "DiTTransformer2DModel", **cfg):
    import diffusers

    shape = dict(num_attention_heads=4, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8, patch_size=2)
    shape.update(cfg)
    if cls_name == "DiTTransformer2DModel":
        model = diffusers.DiTTransformer2DModel(**shape, num_embeds_ada_norm=10, norm_num_groups=4)
        for block in model.transformer_blocks:  # classifier-free guidance's label dropout: a random draw per call
            block.norm1.emb.class_embedder.dropout_prob = 0.0
    else:
        model = diffusers.PixArtTransformer2DModel(
            **shape, out_channels=8, cross_attention_dim=32, caption_channels=12, norm_num_groups=4
        )
    return model.float()


def batch_for(cls_name: str, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    inputs = {"hidden_states": torch.randn(2, 4, 8, 8, generator=g), "timestep": torch.tensor([10, 500])}
    if cls_name == "DiTTransformer2DModel":
        inputs["class_labels"] = torch.tensor([1, 3])
    else:
        inputs["encoder_hidden_states"] = torch.randn(2, 5, 12, generator=g)
        inputs["added_cond_kwargs"] = {"resolution": None, "aspect_ratio": None}
    return inputs
