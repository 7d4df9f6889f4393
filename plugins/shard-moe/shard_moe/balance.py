"""The router's load-balancing loss over the global batch (``ShardConfig(global_batch_balance=True)``).

transformers computes the loss in the model's module (``load_balancing_loss_func(router_logits,
num_experts, top_k, attention_mask)``, called by ``*ForCausalLM.forward``) from the router logits
of the batch in hand: on a data-parallel rank, its part. Qwen's MoE report recommends balancing
over the global batch instead: the fraction of tokens routed to each expert and the mean router
probability counted over every rank's tokens. :func:`over_global_batch` adds a forward hook to the
sharded model alone (nothing of transformers is replaced): after the model's forward it calls the
module's own function (its arithmetic untouched) on every rank's router logits and attention mask,
concatenated over the data-parallel ranks (the gradient of each rank's copy reaching every rank's
router), and puts that in place of the rank's own: ``aux_loss`` becomes the global batch's, and the
loss the model returned gets ``router_aux_loss_coef * (global - local)`` added, so each rank's loss
holds the unsharded model's auxiliary loss on the whole global batch.
"""

from __future__ import annotations

import inspect
import sys

from torch import nn

from shardcore.plugin_api import attached


def loss_module(model: nn.Module):
    """The module that defines ``model``'s ``load_balancing_loss_func``; refused by name for a model
    that computes no load-balancing loss (checked before any collective)."""
    # the model's own class (data parallelism may have put a wrapper class over it)
    modules = (sys.modules.get(cls.__module__) for cls in type(model).__mro__)
    module = next((m for m in modules if hasattr(m, "load_balancing_loss_func")), None)
    if module is None or not hasattr(model, "router_aux_loss_coef"):
        raise NotImplementedError(
            f"ShardConfig(global_batch_balance=True): {type(model).__name__} computes no load-balancing loss "
            "(the *ForCausalLM heads do); shard the causal-LM model or leave it False"
        )
    return module


def over_global_batch(model: nn.Module, gather) -> None:
    """Make ``model``'s load-balancing loss the global batch's (see the module); every rank's
    batch must have the same shape (the gather concatenates equal shapes)."""
    module = loss_module(model)
    signature = inspect.signature(model.forward)

    def whole_batch(mod, args, kwargs, output):
        logits, local = getattr(output, "router_logits", None), getattr(output, "aux_loss", None)
        if not isinstance(logits, tuple) or local is None:  # output_router_logits=False: no auxiliary loss
            return output
        mask = signature.bind_partial(*args, **kwargs).arguments.get("attention_mask")
        gathered = tuple(gather(layer) for layer in logits)
        whole = module.load_balancing_loss_func(
            gathered, mod.num_experts, mod.num_experts_per_tok, None if mask is None else gather(mask)
        )
        if getattr(output, "loss", None) is not None:
            output.loss = output.loss + mod.router_aux_loss_coef * (whole - local).to(output.loss.device)
        output.aux_loss = whole
        return output

    attached(model).after_forward(
        model,
        "global_batch_balance",
        whole_batch,
        with_kwargs=True,
        what="the balancing loss of the global batch",
        after="overflow_agreement",  # its place, declared here: the core's order does not name a plugin's hook
    )
