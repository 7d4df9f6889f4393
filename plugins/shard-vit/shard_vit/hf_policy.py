"""Tensor parallel for HuggingFace ViT and DeiT (``ViTModel``, ``ViTForImageClassification``,
``ViTForMaskedImageModeling``, ``DeiTModel``, ``DeiTForImageClassification``).

Per layer: ``attention.q_proj/k_proj/v_proj`` column parallel by heads (one backward all-reduce
for the three), ``attention.o_proj`` row parallel; ``mlp.fc1`` column, ``mlp.fc2`` row parallel.
Patch embedding, class/distillation tokens, position embeddings, norms, pooler and heads stay
replicated. Attention dropout draws from a per-rank random stream. Structural: imports nothing
from transformers.
"""

from __future__ import annotations

from shardcore import ModulePolicyDescription, Policy, SubModuleReplacementDescription
from shardcore.layers import Linear1D_Col, Linear1D_Row

__all__ = ["HFViTPolicy"]


class HFViTPolicy(Policy):
    def _layer_cls(self) -> type:
        for module in self.model.modules():
            if hasattr(getattr(module, "attention", None), "q_proj") and hasattr(getattr(module, "mlp", None), "fc1"):
                return type(module)
        raise ValueError(f"{type(self.model).__name__}: no ViT layer (attention.q_proj, mlp.fc1) found")

    def config_sanity_check(self) -> None:
        cfg, name = self.model.config, type(self.model).__name__
        self.require_divisible(cfg.num_attention_heads, self.tp_size, "num_attention_heads", name)
        self.require_divisible(cfg.intermediate_size, self.tp_size, "intermediate_size", name)
        self._layer_cls()

    def checkpoint_names(self, names: list[str]) -> dict[str, str]:
        """transformers 5 saves ViT/DeiT under their legacy names (``encoder.layer.0.attention.
        attention.query``): map ours onto them with transformers' own conversion mapping."""
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = [t.reverse_transform() for t in get_model_conversion_mapping(self.model, add_legacy=False)[::-1]]
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        out = {}
        for name in names:
            saved, converter = rename_source_key(name, renamings, converters, reverse=True)
            if converter is not None:
                raise NotImplementedError(f"{name}: checkpoints that merge or split tensors are not supported yet")
            if saved != name:
                out[name] = saved
        return out

    def module_policy(self):
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        heads = {"num_heads": cfg.num_attention_heads, "head_dim": head_dim}
        sub = SubModuleReplacementDescription
        return {
            self._layer_cls(): ModulePolicyDescription(
                attribute_replacement={"attention.num_attention_heads": cfg.num_attention_heads // self.tp_size},
                sub_module_replacement=[
                    sub(suffix="attention.q_proj", target_module=Linear1D_Col, kwargs={**heads, "copy_input": False}),
                    sub(suffix="attention.k_proj", target_module=Linear1D_Col, kwargs={**heads, "copy_input": False}),
                    sub(suffix="attention.v_proj", target_module=Linear1D_Col, kwargs={**heads, "copy_input": False}),
                    sub(suffix="attention.o_proj", target_module=Linear1D_Row, kwargs=heads),
                    sub(suffix="mlp.fc1", target_module=Linear1D_Col),
                    sub(suffix="mlp.fc2", target_module=Linear1D_Row),
                ],
                enter_tp_region=["attention"],
                per_rank_rng=["attention"],
            )
        }
