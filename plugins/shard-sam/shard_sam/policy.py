"""Tensor parallel for SAM (``SamModel``): the image encoder and the mask decoder's two-way transformer.

* **Image encoder** (a ViT with windowed and global attention), every layer: the packed ``qkv``
  split per head (rank ``r`` holds its heads' rows of q, of k and of v), ``proj`` row parallel,
  ``num_attention_heads`` set to this rank's; the MLP's ``lin1`` column and ``lin2`` row parallel.
  The relative positions (``rel_pos_h`` / ``rel_pos_w``, one table for every head) stay
  replicated: each rank applies them to its own heads' queries, so its gradient is its heads'
  share, and a hook sums it over the group (``TensorParallelSpec.grad_sum``), as the unsharded model's
  single table gets the sum over every head.
* **Mask decoder**, in every two-way block and the final token-to-image attention: ``q_proj``,
  ``k_proj``, ``v_proj`` column parallel by heads (query, key and value read different tensors:
  each enters the region on its own), ``out_proj`` row parallel; the block's MLP ``lin1`` column,
  ``lin2`` row parallel.
* **Replicated**: the patch embedding, the neck (convolutions), the prompt encoder (point, box
  and mask embeddings), the shared positional embedding, the decoder's tokens, upscaling and
  hypernetwork MLPs, every norm.

Structural: the classes are read off the model instance, nothing imports transformers.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    TensorParallelSpec,
    attention,
    blocks_in,
    mlp,
    packed_attention,
    require_divisible,
)

__all__ = ["SamPolicy"]

_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")


def _decoder_attention(prefix: str, module, tp: int) -> tuple[dict, list]:
    """Attribute and replacement entries for one of the decoder's ``SamAttention`` modules at ``prefix``."""
    heads = module.num_attention_heads
    subs = attention(prefix, heads, module.internal_dim // heads, names=_NAMES, shared_input=False)
    return {f"{prefix}.num_attention_heads": heads // tp}, subs


class SamPolicy(Policy):
    @property
    def _vision(self):
        return self.model.vision_encoder

    @property
    def _two_way(self):
        return self.model.mask_decoder.transformer

    def blocks(self):
        return blocks_in(self.model, self._vision.layers, self._two_way.layers)

    def config_sanity_check(self) -> None:
        name, tp, cfg = type(self.model).__name__, self.tp_size, self.model.config
        vision, decoder = cfg.vision_config, cfg.mask_decoder_config
        require_divisible(vision.num_attention_heads, tp, "vision_config.num_attention_heads", name)
        require_divisible(vision.mlp_dim, tp, "vision_config.mlp_dim", name)
        require_divisible(decoder.num_attention_heads, tp, "mask_decoder_config.num_attention_heads", name)
        require_divisible(decoder.mlp_dim, tp, "mask_decoder_config.mlp_dim", name)

    def tensor_parallel(self):
        """The image encoder's relative-position tables: replicated, applied by each rank to its heads."""
        tables = ("attn.rel_pos_h", "attn.rel_pos_w")
        return TensorParallelSpec(grad_sum=[n for n, _ in self.model.named_parameters() if n.endswith(tables)])

    def module_policy(self):
        tp = self.tp_size
        vision = self._vision.layers[0].attn
        heads = vision.num_attention_heads
        head_dim = self.model.config.vision_config.hidden_size // heads
        policy = {
            type(self._vision.layers[0]): ModulePolicyDescription(
                attribute_replacement={"attn.num_attention_heads": heads // tp},
                sub_module_replacement=packed_attention("attn", heads, head_dim, names=("qkv", "proj"))
                + mlp("mlp", ("lin1",), "lin2"),
                per_rank_rng=["attn"],
            )
        }
        block = self._two_way.layers[0]
        attrs, subs = {}, mlp("mlp", ("lin1",), "lin2")
        for name in ("self_attn", "cross_attn_token_to_image", "cross_attn_image_to_token"):
            more_attrs, more_subs = _decoder_attention(name, getattr(block, name), tp)
            attrs.update(more_attrs)
            subs += more_subs
        policy[type(block)] = ModulePolicyDescription(attribute_replacement=attrs, sub_module_replacement=subs)
        final = "final_attn_token_to_image"
        final_attrs, final_subs = _decoder_attention(final, getattr(self._two_way, final), tp)
        policy[type(self._two_way)] = ModulePolicyDescription(
            attribute_replacement=final_attrs, sub_module_replacement=final_subs
        )
        return policy
