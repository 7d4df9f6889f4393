"""Tensor parallel for T5, MT5 and UMT5: ``*Model``, ``*ForConditionalGeneration``, ``*EncoderModel``.

Per block, on the model's own forward (Megatron's layout, one all-reduce after each attention
and one after the feed-forward):

* self-attention (``layer[0].SelfAttention``): ``q``, ``k``, ``v`` column parallel by heads (one
  backward all-reduce for the three), ``o`` row parallel; ``n_heads`` / ``inner_dim`` set to this
  rank's heads, which is what the attention's ``view`` and its zero position bias read.
* the relative attention bias (``relative_attention_bias``, an embedding ``[buckets, heads]``: in
  the first block of each stack for T5 and MT5, in every block for UMT5) split by heads
  (:class:`~shardcore.tensor_parallel.ColumnParallelEmbedding1D`, output kept split): each rank
  computes exactly its heads' bias, and the blocks after the first reuse it, as the model does.
  Nothing crosses the wire for it, forward or backward.
* cross-attention (``layer[1].EncDecAttention``, decoder blocks): the same split; the query reads
  the decoder's states and the key/value the encoder's output, each entering the region on its own.
* feed-forward (``DenseReluDense``): ``wi`` (v1.0, ReLU) or ``wi_0`` / ``wi_1`` (v1.1, gated-GELU)
  column parallel, ``wo`` row parallel.
* the shared embedding, each stack's ``embed_tokens`` (tied to it) and the ``lm_head`` (tied or
  not) vocabulary parallel; full logits are gathered, so the model's own loss and ``generate()``
  (greedy and beam) run unchanged, the caches holding this rank's heads.

Replicated: the layer norms (T5's RMS-style ``T5LayerNorm``) and the final norms. Attention and
feed-forward dropout act on split activations and draw from a per-rank stream; the residual
dropouts stay on the shared stream.

Pipeline stages (``*ForConditionalGeneration``, transformers 5): :class:`~shard_t5.stages.T5Stages`,
the encoder and decoder blocks one list of stages, the position bias handed between them.

Structural: the classes are read off the model instance (``layer[0]``, ``layer[1]``,
``layer[-1]`` of each block), so T5, MT5 and UMT5 share the policy and nothing imports transformers.
"""

from __future__ import annotations

from torch import nn

from shardcore import ModulePolicyDescription, Policy
from shardcore import SubModuleReplacementDescription as Sub
from shardcore.plugin_api import (
    ColumnParallelEmbedding1D,
    SequenceSpec,
    attention,
    blocks_in,
    mlp,
    require_divisible,
    vocab_embedding,
    vocab_head,
)

from .stages import T5Stages

__all__ = ["T5Policy"]

_NAMES = ("q", "k", "v", "o")


class T5Policy(T5Stages, Policy):
    """Every T5-architecture model: the encoder and decoder stacks present, their embeddings, the head."""

    def _stacks(self) -> list[nn.Module]:
        """The stacks (modules holding a ``block`` list of T5 blocks), encoder first."""
        return [m for m in self.model.modules() if isinstance(getattr(m, "block", None), nn.ModuleList) and m.block]

    def blocks(self):
        """Encoder blocks, then decoder blocks (those present)."""
        return blocks_in(self.model, *(stack.block for stack in self._stacks()))

    def sequence(self):
        """Megatron sequence parallelism over the encoder's tokens (split at its first block, gathered
        after its last): norms and residuals on this rank's tokens; each attention gathers the whole
        sequence on entry, so the relative position bias is computed over it as before. The decoder
        runs as plain tensor parallelism: its cross-attention reads the encoder's whole output."""
        encoders = [stack for stack in self._stacks() if not getattr(stack, "is_decoder", False)]
        bias = (
            "T5's attention is its own (not transformers' registry) and adds a relative position bias the first "
            "layer computes once for every head and every query/key pair"
        )
        return SequenceSpec(
            modes=("split_gather",),
            refused={
                "all_to_all": f"{bias}; cutting it to a rank's heads after the all-to-all is not built",
                "ring_attn": f"{bias}; cutting it to each travelling key block is not built",
            },
            dropouts=("layer.0.dropout", "layer.1.dropout"),  # the residual dropouts, on split tokens
            regions=[blocks_in(self.model, encoders[0].block)] if encoders else [],
        )

    def _dims(self) -> tuple[int, int, int]:
        cfg = self.model.config
        return cfg.num_heads, cfg.d_kv, cfg.d_ff

    def _gated(self, ff: nn.Module) -> bool:
        return hasattr(ff.DenseReluDense, "wi_0")

    def config_sanity_check(self) -> None:
        """Heads and the feed-forward width must divide the group; checked on every rank before any collective."""
        name = type(self.model).__name__
        heads, _, d_ff = self._dims()
        require_divisible(heads, self.tp_size, "num_heads", name)
        require_divisible(d_ff, self.tp_size, "d_ff", name)
        if not self._stacks():
            raise ValueError(f"{name}: no T5 stack (a module with a 'block' list) found to shard")
        config = self.shard_config
        if config.enable_sequence_parallelism and config.pipeline_parallel_size > 1:
            raise NotImplementedError(
                f"{name}: sequence parallelism with pipeline stages is not built for T5 (a stage entered mid-stack "
                "takes its states in through a hook that would run after the split); use one of them"
            )

    def _layer_classes(self) -> tuple[type, type | None, type]:
        """(self-attention layer, cross-attention layer or None, feed-forward layer) classes."""
        self_attn = cross = ff = None
        for _, block in self.blocks():
            self_attn = self_attn or type(block.layer[0])
            ff = ff or type(block.layer[-1])
            if len(block.layer) == 3:
                cross = cross or type(block.layer[1])
        return self_attn, cross, ff

    def module_policy(self):
        heads, d_kv, _ = self._dims()
        tp = self.tp_size
        self_attn, cross, ff = self._layer_classes()
        first = self.blocks()[0][1]
        per_rank = {"n_heads": heads // tp, "inner_dim": heads // tp * d_kv}
        bias = Sub(
            suffix="SelfAttention.relative_attention_bias",
            target_module=ColumnParallelEmbedding1D,
            kwargs={"num_heads": heads},
            ignore_if_not_exist=True,  # only the first block of T5 / MT5 holds one; every block of UMT5
        )
        policy = {
            self_attn: ModulePolicyDescription(
                attribute_replacement={f"SelfAttention.{k}": v for k, v in per_rank.items()},
                sub_module_replacement=[*attention("SelfAttention", heads, d_kv, names=_NAMES), bias],
                enter_tp_region=["SelfAttention"],  # q, k, v read the normed states: one backward all-reduce
                per_rank_rng=["SelfAttention"],  # attention dropout drops this rank's heads
            ),
            ff: ModulePolicyDescription(
                sub_module_replacement=mlp(
                    "DenseReluDense",
                    ("wi_0", "wi_1") if self._gated(first.layer[-1]) else ("wi",),
                    "wo",
                    shared_input=True,
                ),
                enter_tp_region=["DenseReluDense"],
                per_rank_rng=["DenseReluDense"],  # its dropout acts on the split activations
            ),
        }
        if cross is not None:
            policy[cross] = ModulePolicyDescription(
                attribute_replacement={f"EncDecAttention.{k}": v for k, v in per_rank.items()},
                # the query reads the decoder's states, the key and value the encoder's output
                sub_module_replacement=attention("EncDecAttention", heads, d_kv, names=_NAMES, shared_input=False),
                per_rank_rng=["EncDecAttention"],
            )
        for stack in self._stacks():
            policy[type(stack)] = ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("embed_tokens", self.shard_config)]
            )
        top = []
        if isinstance(getattr(self.model, "shared", None), nn.Embedding):
            top.append(vocab_embedding("shared", self.shard_config))
        if isinstance(getattr(self.model, "lm_head", None), nn.Linear):
            top.append(vocab_head("lm_head", self.shard_config))
        if top:
            policy[type(self.model)] = ModulePolicyDescription(sub_module_replacement=top)
        return policy

    def postprocess(self):
        """The shared embedding *is* the encoder's (one module, as their one weight says): the
        forward never calls ``shared`` itself, so ``get_input_embeddings()`` and ``shardcore
        explain`` see one embedding where the model runs one."""
        stacks = self._stacks()
        if isinstance(getattr(self.model, "shared", None), nn.Module) and stacks:
            encoder = stacks[0].embed_tokens
            if encoder.weight is self.model.shared.weight:
                self.model.shared = encoder
        return self.model
