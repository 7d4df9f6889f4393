"""Tensor-parallel policies for mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE).

Per decoder layer:

* attention as Llama's (Megatron-LM's layout): ``q_proj``/``k_proj``/``v_proj`` column parallel by
  heads (key/value heads replicated when fewer than the ranks), ``o_proj`` row parallel; Qwen3's
  per-head ``q_norm``/``k_norm`` replicated, their gradients (each rank's heads' share) summed;
  OLMoE's, over every head, split with the heads (:class:`~shardcore.tensor_parallel.SplitRMSNorm`:
  the sum of squares all-reduced);
* the sparse MLP: the router (``gate``) replicated, the experts split over the ranks, each rank
  holding ``E / tp`` whole experts (:class:`~shardcore.expert_parallel.experts.ExpertsTP`: each rank adds its
  experts' share of every token, one all-reduce sums them). Splitting each expert's MLP instead
  (Megatron's expert tensor parallelism) is not built: with whole experts a rank runs fewer,
  larger matmuls and the checkpoint reads whole experts;
* a shared expert (Qwen2-MoE) and the dense MLP of layers without experts: column / row parallel
  like Llama's MLP; the shared expert's sigmoid gate (``hidden -> 1``) replicated.

``embed_tokens`` is vocab parallel, ``lm_head`` a vocab-parallel head gathering the logits.
The load-balancing loss (``output_router_logits=True``) is computed from the replicated
router's logits: the unsharded model's.

Under expert parallelism (``ShardConfig(expert_parallel_size=E)``, over the data-parallel ranks)
the experts are split over ``E x tp`` ranks (:class:`~shardcore.expert_parallel.experts.ExpertsEP`: tokens travel
to their experts by all-to-all), everything else as above, data-parallel. With
``global_batch_balance=True`` the load-balancing loss is computed from every data-parallel rank's
router logits (:func:`~shard_moe.balance.over_global_batch`). These models have no router z-loss
in transformers.
"""

from __future__ import annotations

import attrs

from shardcore import ModulePolicyDescription, Policy
from shardcore.plugin_api import (
    ExpertSpec,
    HFStages,
    KernelSpec,
    SequenceSpec,
    SplitRMSNorm,
    StageFacts,
    TensorParallelSpec,
    attention,
    attention_dims,
    block_type,
    blocks_in,
    defer_logits_gather,
    experts,
    mlp,
    require_divisible,
    require_kv_heads,
    vocab_embedding,
    vocab_head,
)
from shardcore.plugin_api import (
    SubModuleReplacementDescription as Sub,
)

__all__ = ["MoeForCausalLMPolicy", "MoeModelPolicy", "MoePolicy"]


def _optional(subs: list[Sub]) -> list[Sub]:
    """A layer has either a sparse MLP or a dense one (Qwen's ``mlp_only_layers``): each rule
    applies where its module exists."""
    return [attrs.evolve(s, ignore_if_not_exist=True) for s in subs]


class MoePolicy(Policy):
    """Shared by every head: shards the base model (``model.base_model``)."""

    @property
    def base(self):
        return self.model.base_model

    def blocks(self):
        return blocks_in(self.model, self.base.layers)

    def _norms_span_heads(self) -> bool:
        """OLMoE's ``q_norm`` / ``k_norm`` normalize the projection over every head (Qwen3's: each head)."""
        norm = getattr(self.blocks()[0][1].self_attn, "q_norm", None)
        return norm is not None and norm.weight.shape[0] > self._dims()[2]

    def _dims(self):
        return attention_dims(self.model.config)

    def kernels(self):
        # the RMSNorm class of the final norm (and of every layer's): weight * x / rms(x); the q / k norms the
        # sharder split are SplitRMSNorm, not this class
        return KernelSpec(norm_classes=(type(self.base.norm),))

    def sequence(self):
        heads, kv, _ = self._dims()
        return SequenceSpec(
            # Megatron's split (the experts see the gathered tokens in the TP region), Ulysses and the ring
            # (transformers' attention registry), the rotary cos / sin split with the tokens
            modes=("split_gather", "all_to_all", "ring_attn"),
            split_kwargs=("position_embeddings",),
            heads=(heads, kv),
        )

    def config_sanity_check(self) -> None:
        cfg, tp = self.model.config, self.tp_size
        name = type(self.model).__name__
        heads, kv, _ = self._dims()
        require_divisible(heads, tp, "num_attention_heads", name)
        require_kv_heads(kv, heads, tp, name)
        layouts = {type(m).__name__ for n, m in self.model.named_modules() if n.endswith(".experts")}
        unfused = [
            m for n, m in self.model.named_modules() if n.endswith(".experts") and not hasattr(m, "gate_up_proj")
        ]
        if unfused:
            import transformers

            raise NotImplementedError(
                f"{name}: shard-moe shards the fused expert weights of transformers 5 (experts.gate_up_proj "
                f"[experts, 2 x intermediate, hidden]); transformers {transformers.__version__} keeps the experts "
                f"as {', '.join(sorted(layouts))} (one module per expert), which is not built: use transformers >= 5"
            )
        experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
        ep = self.shard_config.expert_parallel_size
        require_divisible(experts, tp, "num_experts", name)
        if experts % (ep * tp):
            raise ValueError(
                f"{name}: num_experts={experts} do not split over expert_parallel_size={ep} x "
                f"tensor_parallel_size={tp} = {ep * tp} ranks; choose sizes whose product divides {experts}"
            )
        for field in ("intermediate_size", "shared_expert_intermediate_size"):
            size = getattr(cfg, field, None)
            if size:
                require_divisible(size, tp, field, name)
        if self._norms_span_heads() and kv % tp:
            raise ValueError(
                f"{name}: k_norm normalizes the keys over every key/value head, which are not replicated across "
                f"ranks; num_key_value_heads={kv} must be divisible by tensor_parallel_size={tp}"
            )
        if self.shard_config.global_batch_balance:
            from .balance import loss_module

            loss_module(self.model)
        self._check_router_loss(name)
        if getattr(cfg, "router_jitter_noise", 0.0):
            raise NotImplementedError(
                f"{name}: router_jitter_noise={cfg.router_jitter_noise} draws the router's noise per rank; "
                "set it to 0 to shard"
            )

    def _check_router_loss(self, name: str) -> None:
        """The router's auxiliary loss balances every layer's and every token's routing at once: a
        pipeline stage sees its layers only, a sequence split its tokens only."""
        if not getattr(self.model.config, "output_router_logits", False):
            return
        sc = self.shard_config
        split = sc.enable_sequence_parallelism or sc.sequence_parallel_size > 1
        if sc.pipeline_parallel_size > 1 or split:
            what = "pipeline stages" if sc.pipeline_parallel_size > 1 else "a sequence split"
            raise NotImplementedError(
                f"{name}: output_router_logits=True adds the router's load-balancing loss over every layer's and "
                f"every token's routing at once; under {what} each rank sees only its "
                f"{'layers' if sc.pipeline_parallel_size > 1 else 'tokens'}, which is not built: set "
                "config.output_router_logits=False (or shard without that layout)"
            )

    def module_policy(self):
        heads, kv, head_dim = self._dims()
        tp = self.tp_size
        local_kv = kv // tp if kv >= tp else 1
        split = experts("mlp.experts", self.shard_config, self.layout)  # the core picks the layer
        if self.shard_config.expert_parallel_size > 1 and tp == 1:  # the experts alone: the rest whole, data-parallel
            return {
                block_type(self.blocks(), self.model): ModulePolicyDescription(
                    sub_module_replacement=_optional([split])
                )
            }
        dense = mlp("mlp", ("gate_proj", "up_proj"), "down_proj")  # each column layer copies its input
        shared = mlp("mlp.shared_expert", ("gate_proj", "up_proj"), "down_proj")
        norms = [Sub(suffix=f"self_attn.{n}", target_module=SplitRMSNorm) for n in ("q_norm", "k_norm")]
        return {
            block_type(self.blocks(), self.model): ModulePolicyDescription(
                attribute_replacement={"self_attn.num_key_value_groups": (heads // tp) // local_kv},
                sub_module_replacement=attention("self_attn", heads, head_dim, kv_heads=kv)
                + (norms if self._norms_span_heads() else [])
                + _optional([split, *dense, *shared]),
                enter_tp_region=["self_attn"],
                per_rank_rng=["self_attn"],
            ),
            type(self.base): ModulePolicyDescription(
                sub_module_replacement=[vocab_embedding("embed_tokens", self.shard_config)]
            ),
        }

    def experts(self):
        from .balance import over_global_batch

        return ExpertSpec(supported=True, balance=lambda gather: over_global_batch(self.model, gather))

    def tensor_parallel(self):
        """Replicated weights that each rank applies to its own heads only (Qwen3's per-head
        ``q_norm`` / ``k_norm``): each rank's gradient is its heads' share, summed over the group."""
        if self._norms_span_heads():  # split with the heads (SplitRMSNorm), not replicated
            return TensorParallelSpec()
        norms = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
        return TensorParallelSpec(grad_sum=[n for n, _ in self.model.named_parameters() if n.endswith(norms)])


class MoeModelPolicy(MoePolicy):
    """``MixtralModel`` / ``Qwen2MoeModel`` / ``Qwen3MoeModel``: the decoder stack alone."""


class MoeForCausalLMPolicy(HFStages, MoePolicy):
    """``*ForCausalLM``: the base model plus a vocab-parallel ``lm_head`` gathering the logits; pipeline
    stages on the model's own forward (each layer's experts on the stage that holds the layer)."""

    def stages(self):
        return StageFacts(first_ends=("embed_tokens",), last_ends=("norm",))

    def module_policy(self):
        policy = super().module_policy()
        if self.tp_size == 1:
            return policy
        policy[type(self.model)] = ModulePolicyDescription(
            sub_module_replacement=[vocab_head("lm_head", self.shard_config)],
        )
        return policy

    def postprocess(self):
        model = super().postprocess()
        if self.tp_size == 1:
            return model
        defer_logits_gather(model, model.lm_head)  # the loss on the vocabulary slices, the logits gathered
        return model
