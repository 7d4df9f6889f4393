"""Tensor parallel for timm's ``VisionTransformer`` (every ``vit_*`` / ``deit_*`` model).

Per block: the packed ``attn.qkv`` is split *per head* (:class:`FusedLinear1D_Col`: rank ``r``
holds its heads' rows of q, of k and of v, never a contiguous block of rows), ``attn.proj`` is
row parallel; ``mlp.fc1`` column, ``mlp.fc2`` row parallel. Patch embedding, class and register
tokens, position embeddings, norms, pooling ('token', 'avg', ...) and the head stay replicated.
Attention dropout and the MLP's inner dropout draw from a per-rank random stream, the projection
dropout after ``attn.proj`` (on replicated activations) from the shared one. Structural:
imports nothing from timm.

Pipeline stages: the patch embedding, class / register tokens and position embedding on the
first stage (which runs ``forward_features``, later blocks and the final norm as holes), the
final norm, pooling and head on the last (``forward_head``). timm models take no labels:
``pipeline_step(model, {"x": images, "labels": classes})`` trains on the cross-entropy averaged
over the batch, as timm's ``train.py`` does without label smoothing or mixup.
"""

from __future__ import annotations

from torch import nn

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    KernelSpec,
    PipelineSpec,
    SequenceSpec,
    blocks_in,
    in_blocks,
    mlp,
    packed_attention,
    require_divisible,
)

__all__ = ["TimmViTPolicy"]


def _is_identity(module) -> bool:
    return module is None or isinstance(module, nn.Identity)


class TimmViTPolicy(Policy):
    def sequence(self):
        """Megatron sequence parallelism over the tokens (class / register tokens and patches; a length
        the group does not divide runs unsplit). No Ulysses: timm's attention calls
        ``F.scaled_dot_product_attention`` itself, with no registry to route it through."""
        # the dropouts after the row-parallel projections: on this rank's tokens when split
        return SequenceSpec(modes=("split_gather",), dropouts=("attn.proj_drop", "mlp.drop2"))

    def blocks(self):
        blocks = getattr(self.model, "blocks", None)
        if not blocks:
            raise ValueError(f"{type(self.model).__name__}: no transformer blocks to shard")
        return blocks_in(self.model, blocks)

    def _block(self):
        return self.blocks()[0][1]

    def kernels(self):
        # timm's LayerNorm subclasses nn.LayerNorm and computes F.layer_norm (unless timm's fast_norm
        # is switched on, which shardcore then replaces by the same kernel choice). Fused: fc1, GeLU,
        # fc2 (bias + GeLU); an MLP whose hidden dropout draws (p > 0) stays eager: that dropout runs
        # on a per-rank random stream, which a compiled graph would not keep.
        return KernelSpec(
            norm_classes=tuple({type(m) for m in self.model.modules() if isinstance(m, nn.LayerNorm)}),
            fusible=[
                (n, m) for n, m in in_blocks(self.blocks(), "mlp") if getattr(getattr(m, "drop1", None), "p", 0) == 0
            ],
            attention_backend=self._attention_backend,
        )

    def _attention_backend(self, backend: str) -> str:
        """timm's own switch: every attention with ``fused_attn`` runs ``F.scaled_dot_product_attention``
        (on CUDA in fp16/bf16 torch picks its flash kernel itself; timm has no flash-attn path)."""
        count = 0
        for module in self.model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn, count = True, count + 1
        if not count:
            raise NotImplementedError(f"timm {type(self.model).__name__}: no attention with fused_attn to switch")
        return "sdpa (timm fused_attn)"

    def config_sanity_check(self) -> None:
        name = f"timm {type(self.model).__name__}"
        block = self._block()
        attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
        if not isinstance(getattr(attn, "qkv", None), nn.Linear) or not isinstance(
            getattr(mlp, "fc1", None), nn.Linear
        ):
            raise NotImplementedError(
                f"{name}: block type {type(block).__name__} (attention {type(attn).__name__}, "
                f"MLP {type(mlp).__name__}) is not supported; shard-vit needs attn.qkv and mlp.fc1/fc2 Linear layers"
            )
        if not hasattr(attn, "attn_dim"):
            import timm

            raise NotImplementedError(
                f"{name}: timm {timm.__version__} reshapes the attention output to the input width, which a "
                "rank holding some heads cannot; shard-vit needs timm 1.0.23 or newer (attention with attn_dim)"
            )
        unsupported = [n for n in ("q_norm", "k_norm", "norm") if not _is_identity(getattr(attn, n, None))]
        unsupported += ["attn.gate"] if getattr(attn, "gate", None) is not None else []
        unsupported += ["mlp.norm"] if not _is_identity(getattr(mlp, "norm", None)) else []
        if unsupported:
            raise NotImplementedError(
                f"{name}: {', '.join(unsupported)} inside attention/MLP is not supported under TP yet"
            )
        require_divisible(attn.num_heads, self.tp_size, "num_heads", name)
        require_divisible(mlp.fc1.out_features, self.tp_size, "mlp hidden features", name)

    def module_policy(self):
        block = self._block()
        attn, tp = block.attn, self.tp_size
        return {
            type(block): ModulePolicyDescription(
                attribute_replacement={"attn.num_heads": attn.num_heads // tp, "attn.attn_dim": attn.attn_dim // tp},
                sub_module_replacement=packed_attention("attn", attn.num_heads, attn.head_dim, copy_input=False)
                + mlp("mlp"),
                # the attention reads its input's length (B, N, C = x.shape): it takes the input
                # already gathered when the sequence is split
                enter_tp_region=["attn"],
                per_rank_rng=["attn", "mlp.drop1"],  # dropout on this rank's heads / hidden units
                shared_rng=["attn.proj_drop"],  # ... but proj_drop acts on the replicated output
            )
        }

    # -- pipeline parallelism (classification) ---------------------------------------------------

    def pipeline(self):
        return PipelineSpec(
            ends=self._pp_ends(),
            inputs=self._pp_inputs,
            stage_forward=self._pp_stage_forward,
            output=self._pp_output,
            num_items=self._pp_num_items,
            loss=self._pp_loss,
        )

    def _pp_ends(self):
        model = self.model
        first = [
            n for n in ("patch_embed", "pos_drop", "patch_drop", "norm_pre") if getattr(model, n, None) is not None
        ]
        first += [n for n in ("cls_token", "reg_token", "pos_embed") if getattr(model, n, None) is not None]
        last = [n for n in ("norm", "fc_norm", "attn_pool", "head_drop", "head") if getattr(model, n, None) is not None]
        return {**dict.fromkeys(first, "first"), **dict.fromkeys(last, "last")}

    def _pp_inputs(self, batch, training=True):
        batch = {k: v for k, v in batch.items() if v is not None}
        if set(batch) - {"x", "labels"} or "x" not in batch or (training and "labels" not in batch):
            raise ValueError(
                f"pipeline stages of timm {type(self.model).__name__} take x (images) and labels (class indices, "
                f"training); got {sorted(batch)}"
            )
        return (batch["x"],), batch.get("labels")

    def _pp_stage_forward(self, inputs, *, first, last):
        (x,) = inputs  # images on the first stage, tokens after it
        model = self.model
        if first:  # later blocks and the final norm are holes here
            return model.forward_features(x)
        x = model.blocks(x)  # this stage's blocks; the others are holes
        return model.forward_head(model.norm(x)) if last else x

    def _pp_num_items(self, labels):
        return labels.shape[0]

    def _pp_loss(self, output, labels, num_items):
        import torch.nn.functional as F

        return F.cross_entropy(output, labels, reduction="sum") / num_items

    def _pp_output(self, output, loss):
        return output  # timm returns the logits
