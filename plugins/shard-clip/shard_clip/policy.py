"""Tensor parallel for CLIP: ``CLIPModel``, ``CLIPVisionModel``, ``CLIPTextModel`` and their
``*WithProjection`` variants (the vision tower Llava and many vision-language models use).

Per encoder layer of each tower present (each with its own head count) (one all-reduce after the attention and one after the
MLP, forward): ``q_proj``, ``k_proj``, ``v_proj`` column parallel by heads (one backward
all-reduce for the three), ``out_proj`` row parallel, ``num_heads`` set to this rank's; ``fc1``
column, ``fc2`` row parallel. The text tower's ``token_embedding`` is vocabulary parallel.

Replicated: the patch embedding (a convolution), the class embedding, the position embeddings,
every layer norm, the projections into the joint space and ``logit_scale``. Attention dropout
draws per rank. Structural: the towers are found on the model instance (modules whose ``layers``
are CLIP encoder layers), nothing imports transformers.
"""

from __future__ import annotations

from torch import nn

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    attention,
    blocks_in,
    mlp,
    require_divisible,
    vocab_embedding,
)

__all__ = ["CLIPPolicy"]

_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")


def _is_layer(module: nn.Module) -> bool:
    return hasattr(module, "self_attn") and hasattr(module, "mlp") and hasattr(module.mlp, "fc1")


class CLIPPolicy(Policy):
    def _encoders(self) -> list[nn.Module]:
        """The towers' encoders (modules holding ``layers`` of CLIP encoder layers), text first if present."""
        return [
            m
            for m in self.model.modules()
            if isinstance(getattr(m, "layers", None), nn.ModuleList) and m.layers and all(map(_is_layer, m.layers))
        ]

    def blocks(self):
        return blocks_in(self.model, *(encoder.layers for encoder in self._encoders()))

    def config_sanity_check(self) -> None:
        name = type(self.model).__name__
        if not self._encoders():
            raise ValueError(f"{name}: no CLIP encoder layers (self_attn, mlp.fc1) found to shard")
        for path, layer in self.blocks():
            require_divisible(layer.self_attn.num_heads, self.tp_size, "num_attention_heads", f"{name}.{path}")
            require_divisible(layer.mlp.fc1.out_features, self.tp_size, "intermediate_size", f"{name}.{path}")

    def module_policy(self):
        """Per tower (the vision and the text transformer are different classes, their encoder
        layers one class with each tower's own head count): every layer's attention and MLP."""
        tp, policy = self.tp_size, {}
        owners = {id(m.encoder): m for m in self.model.modules() if isinstance(getattr(m, "encoder", None), nn.Module)}
        for encoder in self._encoders():
            owner = owners[id(encoder)]
            subs, attrs, regions = [], {}, []
            for i, layer in enumerate(encoder.layers):
                heads, head_dim = layer.self_attn.num_heads, layer.self_attn.head_dim
                at = f"encoder.layers.{i}"
                attrs[f"{at}.self_attn.num_heads"] = heads // tp
                subs += attention(f"{at}.self_attn", heads, head_dim, names=_NAMES) + mlp(f"{at}.mlp")
                regions.append(f"{at}.self_attn")
            policy[type(owner)] = ModulePolicyDescription(
                attribute_replacement=attrs,
                sub_module_replacement=subs,
                enter_tp_region=regions,  # q, k, v read one tensor: one backward all-reduce
                per_rank_rng=regions,  # attention dropout drops this rank's heads
            )
        for module in self.model.modules():
            if isinstance(getattr(module, "token_embedding", None), nn.Embedding):
                policy[type(module)] = ModulePolicyDescription(
                    sub_module_replacement=[vocab_embedding("token_embedding", self.shard_config)]
                )
        return policy
