"""Tensor parallel for HuggingFace ViT and DeiT (``ViTModel``, ``ViTForImageClassification``,
``ViTForMaskedImageModeling``, ``DeiTModel``, ``DeiTForImageClassification``).

Per layer: ``attention.q_proj/k_proj/v_proj`` column parallel by heads (one backward all-reduce
for the three), ``attention.o_proj`` row parallel; ``mlp.fc1`` column, ``mlp.fc2`` row parallel
(transformers 4.x: ``attention.attention.query/key/value``, ``attention.output.dense``,
``intermediate.dense``, ``output.dense``, the same way).
Patch embedding, class/distillation tokens, position embeddings, norms, pooler and heads stay
replicated. Attention dropout draws from a per-rank random stream. Structural: imports nothing
from transformers.

Pipeline stages (``*ForImageClassification``): the embeddings on the first stage, the final
LayerNorm and the classifier on the last; later stages take the hidden states where the model
takes ``pixel_values`` (the embeddings' hole hands them through), so every stage runs the model's
own forward.
"""

from __future__ import annotations

from torch import nn

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    CheckpointSpec,
    KernelSpec,
    PipelineSpec,
    SequenceSpec,
    attention,
    block_type,
    blocks_in,
    classification_items,
    classification_loss,
    in_blocks,
    mlp,
    require_divisible,
)

__all__ = ["HFViTPolicy"]


def _is_layer(module) -> bool:
    return _is_v5_layer(module) or _is_v4_layer(module)


def _is_v5_layer(module) -> bool:
    """transformers 5: ``attention.{q,k,v,o}_proj`` and ``mlp.fc1/fc2``."""
    return hasattr(getattr(module, "attention", None), "q_proj") and hasattr(getattr(module, "mlp", None), "fc1")


def _is_v4_layer(module) -> bool:
    """transformers 4.x: ``attention.attention.{query,key,value}``, ``attention.output.dense``,
    ``intermediate.dense``, ``output.dense``."""
    attn = getattr(module, "attention", None)
    return hasattr(getattr(attn, "attention", None), "query") and hasattr(
        getattr(module, "intermediate", None), "dense"
    )


class HFViTPolicy(Policy):
    def sequence(self):
        """Megatron sequence parallelism, Ulysses and the ring (transformers 5's attention registry)
        over the tokens: the class (and distillation) token and the patches. ViT's 1 + n*n tokens
        divide by 2 for odd n and never by 4; DeiT's 2 + n*n by 2 for even n: a length the group does
        not divide runs unsplit (plain tensor parallelism). The attention is bidirectional: the ring
        splits the tokens in contiguous parts (``causal=False``), one a rank, not in 2 x sp zigzag chunks."""
        heads = self.model.config.num_attention_heads
        return SequenceSpec(
            modes=("split_gather", "all_to_all", "ring_attn"),
            causal=False,
            # the residual dropout (transformers 5: the layer's one ``dropout``, applied after attention
            # and after the MLP; 4.x: the attention output's and the output's)
            dropouts=("dropout", "attention.output.dropout", "output.dropout"),
            heads=(heads, heads),
        )

    def blocks(self):
        """The layer stack: the first ``ModuleList`` of layers with ``attention`` and ``mlp`` (its
        place differs between transformers versions: ``vit.layers`` or ``vit.encoder.layer``)."""
        for module in self.model.modules():
            if isinstance(module, nn.ModuleList) and module and all(_is_layer(m) for m in module):
                return blocks_in(self.model, module)
        raise ValueError(
            f"{type(self.model).__name__}: no ViT layers found (attention.q_proj + mlp.fc1 in transformers 5, "
            "attention.attention.query + intermediate.dense in 4.x)"
        )

    def kernels(self):
        # transformers 5: mlp (fc1, GeLU, fc2); 4.x: intermediate (bias + GeLU), output (bias + dropout + residual)
        return KernelSpec(fusible=in_blocks(self.blocks(), "mlp", "intermediate", "output"))

    def _layer_cls(self) -> type:
        layer_cls = block_type(self.blocks(), self.model)
        return layer_cls

    def config_sanity_check(self) -> None:
        cfg, name = self.model.config, type(self.model).__name__
        require_divisible(cfg.num_attention_heads, self.tp_size, "num_attention_heads", name)
        require_divisible(cfg.intermediate_size, self.tp_size, "intermediate_size", name)
        self._layer_cls()

    def checkpoints(self):
        return CheckpointSpec(names=self._checkpoint_names)

    def _checkpoint_names(self, names: list[str]) -> dict[str, str]:
        """transformers 5 saves ViT/DeiT under their legacy names (``encoder.layer.0.attention.
        attention.query``): map ours onto them with transformers' own conversion mapping. Under
        4.x the module names are the checkpoint names."""
        if _is_v4_layer(self.blocks()[0][1]):
            return {}
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
        cfg, tp = self.model.config, self.tp_size
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        heads = cfg.num_attention_heads
        if _is_v4_layer(self.blocks()[0][1]):
            names = ("attention.query", "attention.key", "attention.value", "output.dense")
            return {
                self._layer_cls(): ModulePolicyDescription(
                    attribute_replacement={  # the self-attention reshapes its output to all_head_size
                        "attention.attention.num_attention_heads": heads // tp,
                        "attention.attention.all_head_size": heads // tp * head_dim,
                    },
                    sub_module_replacement=attention("attention", heads, head_dim, names=names)
                    + mlp("", inputs=("intermediate.dense",), output="output.dense"),
                    enter_tp_region=["attention"],
                    per_rank_rng=["attention.attention"],  # dropout on this rank's attention heads
                )
            }
        return {
            self._layer_cls(): ModulePolicyDescription(
                attribute_replacement={"attention.num_attention_heads": cfg.num_attention_heads // self.tp_size},
                sub_module_replacement=attention("attention", cfg.num_attention_heads, head_dim) + mlp("mlp"),
                enter_tp_region=["attention"],
                per_rank_rng=["attention"],
            )
        }

    # -- pipeline parallelism (image classification) -------------------------------------------

    def pipeline(self):
        return PipelineSpec(
            ends=self._pp_ends(),
            inputs=self._pp_inputs,
            stage_forward=self._pp_stage_forward,
            output=self._pp_output,
            num_items=self._pp_num_items,
            loss=self._pp_loss,
            block_returns_tuple=self._pp_block_returns_tuple,
        )

    @property
    def _pp_block_returns_tuple(self) -> bool:
        return _is_v4_layer(self.blocks()[0][1])  # transformers 4.x layers return (hidden, ...)

    def _base_path(self) -> str:
        name = type(self.model).__name__
        if not name.endswith("ForImageClassification"):
            raise NotImplementedError(f"pipeline stages are built for *ForImageClassification, not {name}")
        return next(n for n, m in self.model.named_modules() if m is self.model.base_model)

    def _pp_ends(self):
        pre = self._base_path() + "."
        ends = {f"{pre}embeddings": "first", f"{pre}layernorm": "last", "classifier": "last"}
        if getattr(self.model.base_model, "pooler", None) is not None:
            ends[f"{pre}pooler"] = "last"
        return ends

    def _pp_inputs(self, batch, training=True):
        batch = {k: v for k, v in batch.items() if v is not None and (training or k != "return_dict")}
        if (
            set(batch) - {"pixel_values", "labels"}
            or "pixel_values" not in batch
            or (training and "labels" not in batch)
        ):
            raise ValueError(
                f"pipeline stages of {type(self.model).__name__} take pixel_values and labels (training); "
                f"got {sorted(batch)}"
            )
        return (batch["pixel_values"],), batch.get("labels")

    def _pp_stage_forward(self, inputs, *, first, last):
        (x,) = inputs  # pixel values on the first stage, hidden states after it
        if last:
            return self.model(pixel_values=x).logits
        return self.model.base_model(pixel_values=x).last_hidden_state

    def _pp_num_items(self, labels):
        return classification_items(self.model.config, labels)

    def _pp_loss(self, output, labels, num_items):
        return classification_loss(self.model.config, output, labels, num_items)

    def _pp_output(self, output, loss):
        from transformers.modeling_outputs import ImageClassifierOutput

        return ImageClassifierOutput(loss=loss, logits=output)
