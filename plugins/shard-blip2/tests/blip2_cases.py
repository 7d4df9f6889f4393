"""A tiny BLIP-2 (vision encoder, Q-Former, an OPT or a T5 language model) and its batches:
random weights, fp32, dropout 0."""

from __future__ import annotations

import torch

VOCAB = 1001
IMAGE = VOCAB - 1  # the image token's id: one per query token in the prompt
QUERIES = 4


def build(cls_name: str = "Blip2ForConditionalGeneration", language: str = "opt", *, scale: float = 5.0, **text):
    import transformers

    vision = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    vision.update(image_size=16, patch_size=8, attention_dropout=0.0)
    vision.update(initializer_range=0.02)  # Blip2VisionConfig's default, 1e-10, leaves its gradients at ~1e-15
    qformer = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    qformer.update(encoder_hidden_size=32, cross_attention_frequency=2)  # a cross-attention in layer 0 only
    qformer.update(attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    if language == "opt":
        lm = {"model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_attention_heads": 4, "num_hidden_layers": 2}
        lm.update(word_embed_proj_dim=64, pad_token_id=1, dropout=0.0, max_position_embeddings=64)
    else:
        lm = {"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 256, "num_heads": 4, "num_layers": 2}
        lm.update(num_decoder_layers=2, relative_attention_num_buckets=8, decoder_start_token_id=0, dropout_rate=0.0)
    lm.update(vocab_size=VOCAB, **text)
    config = transformers.Blip2Config(
        vision_config=vision, qformer_config=qformer, text_config=lm, num_query_tokens=QUERIES, image_token_index=IMAGE
    )
    model = getattr(transformers, cls_name)(config).float()
    # the query tokens start at zero here, and the Q-Former's first layer norm of zeros sends its gradient to
    # ~1e18; a released BLIP-2's are trained: random ones, as a checkpoint's would be
    with torch.no_grad():
        model.query_tokens.normal_(std=config.initializer_range)
        # and the vision encoder's and Q-Former's matrices ``scale`` x their initialization: at 1x their attention
        # is nearly uniform and some of their gradients sit below 1e-5 of the largest (untestable in fp32)
        for part in (model.vision_model, model.qformer):
            for p in part.parameters():
                if p.dim() >= 2:
                    p.mul_(scale)
    return model


def batch_for(language: str = "opt", seed: int = 1, rows: int = 2, labels: bool = True) -> dict:
    """The image's query tokens then text (an OPT prompt; the encoder's input for a T5), and labels."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(3, IMAGE, (rows, 6), generator=g)
    ids = torch.cat([torch.full((rows, QUERIES), IMAGE), text], dim=1)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": torch.randn(rows, 3, 16, 16, generator=g),
    }
    if labels:  # an OPT's labels are the prompt's (its image tokens ignored); a T5's are the decoder's
        batch["labels"] = (
            torch.randint(3, IMAGE, (rows, 5), generator=g) if language == "t5" else ids.masked_fill(ids == IMAGE, -100)
        )
        batch["use_cache"] = False  # a training step: no key/value cache in the outputs
    return batch
