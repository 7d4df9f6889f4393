"""The router's load-balancing loss over the global batch (``ShardConfig(global_batch_balance=True)``).

transformers computes the loss in the model's module (``load_balancing_loss_func(router_logits,
num_experts, top_k, attention_mask)``, called by ``*ForCausalLM.forward``) from the router logits
of the batch in hand: on a data-parallel rank, its part. Qwen's MoE report recommends balancing
over the global batch instead: the fraction of tokens routed to each expert and the mean router
probability counted over every rank's tokens. :func:`over_global_batch` wraps the module's own
function (its arithmetic untouched): while a sharded model that asked for it runs its forward, the
function receives every rank's router logits and attention mask, concatenated over the
data-parallel ranks (the gradient of each rank's copy of the loss reaching every rank's router),
so each rank's loss holds the unsharded model's auxiliary loss on the whole global batch. Other
models in the process, and this one outside its forward, call the function as it was.
"""

from __future__ import annotations

import functools
import sys
import threading

from torch import nn

_ACTIVE = threading.local()


def _wrapped(original):
    @functools.wraps(original)
    def load_balancing_loss_func(gate_logits, num_experts=None, top_k=2, attention_mask=None):
        gather = getattr(_ACTIVE, "gather", None)
        if gather is not None and isinstance(gate_logits, tuple):
            gate_logits = tuple(gather(layer) for layer in gate_logits)
            if attention_mask is not None:
                attention_mask = gather(attention_mask)
        return original(gate_logits, num_experts, top_k, attention_mask)

    load_balancing_loss_func.shardcore_original = original
    return load_balancing_loss_func


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
    if not hasattr(module.load_balancing_loss_func, "shardcore_original"):
        module.load_balancing_loss_func = _wrapped(module.load_balancing_loss_func)

    def enter(mod, args, kwargs):
        _ACTIVE.gather = gather

    def leave(mod, args, kwargs, output):
        _ACTIVE.gather = None

    model.register_forward_pre_hook(enter, with_kwargs=True)
    model.register_forward_hook(leave, with_kwargs=True, always_call=True)
