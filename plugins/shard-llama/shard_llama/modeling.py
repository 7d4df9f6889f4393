"""Modeling overrides for Llama-architecture models, used when ``parallel_output=True``."""

from __future__ import annotations

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

try:
    from transformers.modeling_utils import slice_logits_to_keep
except ImportError:  # transformers < 4.52 slices inline in each forward

    def slice_logits_to_keep(hidden: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
        """The positions whose logits are computed: the last ``logits_to_keep`` (0: all), or those indexed."""
        index = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        return hidden[:, index, :]


from shardcore.losses import causal_lm_loss_on_slices


def causal_lm_forward(
    self,
    input_ids=None,
    attention_mask=None,
    position_ids=None,
    past_key_values=None,
    inputs_embeds=None,
    labels=None,
    use_cache=None,
    logits_to_keep=0,
    **kwargs,
):
    """``*ForCausalLM.forward`` returning this rank's vocabulary slice of the logits.

    The loss is the vocab-parallel cross entropy: no rank ever holds the full logits.
    """
    num_items_in_batch = kwargs.pop("num_items_in_batch", None)
    shift_labels = kwargs.pop("shift_labels", None)
    outputs = self.model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        **kwargs,
    )
    logits = self.lm_head(slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep))
    loss = None
    if labels is not None or shift_labels is not None:
        loss = causal_lm_loss_on_slices(
            logits, labels, self.lm_head, num_items_in_batch=num_items_in_batch, shift_labels=shift_labels
        )
    return CausalLMOutputWithPast(
        loss=loss,
        logits=logits,
        past_key_values=outputs.past_key_values,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )


def generate_needs_full_logits(*args, **kwargs):
    raise RuntimeError(
        "generate() needs full-vocabulary logits, but this model was sharded with "
        "ShardConfig(parallel_output=True), which keeps them split over the ranks; "
        "shard with parallel_output=False (the default) to generate."
    )
