"""A tiny SAM and its batches: random weights, fp32, dropout 0."""

from __future__ import annotations

import torch

#: the image encoder wider than the decoder, as in every released SAM (ViT-B's encoder: 86M of its 94M)
VISION = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2, "mlp_dim": 256}
VISION.update(image_size=32, patch_size=8, output_channels=16, window_size=2, global_attn_indexes=[1], num_pos_feats=8)
VISION.update(initializer_range=0.1)  # SamVisionConfig's default, 1e-10, leaves the encoder's gradients at ~1e-20
# no qkv bias: its key third's gradient is zero in exact arithmetic (softmax ignores a key bias), packed in one
# tensor with the query and value biases, which zero_grads cannot name apart; Adam turned its fp32 noise into
# steps of 1.6e-5 (the packed bias's split is checked by the core's layer tests)
VISION.update(qkv_bias=False)
PROMPT = {"hidden_size": 16, "image_size": 32, "patch_size": 8, "mask_input_channels": 4}
DECODER = {
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "mlp_dim": 32,
    "iou_head_hidden_dim": 16,
}


def build(**vision):
    import transformers

    config = transformers.SamConfig(
        vision_config={**VISION, **vision}, prompt_encoder_config=PROMPT, mask_decoder_config=DECODER
    )
    model = transformers.SamModel(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("rel_pos_h", "rel_pos_w")):  # they start at zero; a trained SAM's are not
                p.normal_(std=0.5)
            elif p.dim() >= 2 and name.startswith("mask_decoder."):
                # the decoder at 10x its initialization: at 1x its image-to-token attention's queries get
                # gradients below 1e-5 of the largest (untestable in fp32); at 10x, 1e-4
                p.mul_(10.0)
    return model


def batch_for(seed: int = 1, rows: int = 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "pixel_values": torch.randn(rows, 3, 32, 32, generator=g),
        "input_points": torch.rand(rows, 1, 2, 2, generator=g) * 32,
    }
