"""Pipeline stages of a HuggingFace model, on its own forward: one mixin every HF plugin shares.

A stage runs the model itself, pruned to its blocks (see :mod:`shardcore.pipeline`): the first
stage takes ``input_ids``, later stages take the previous stage's hidden states as
``inputs_embeds``, and the last calls the whole model so that its own head (and any scaling or
soft cap it applies) produces the logits. The small inputs every stage needs (the attention mask,
positions or token types) travel with the hidden states. A policy mixes :class:`HFStages` in
before :class:`~shardcore.Policy` (its :meth:`~HFStages.pipeline` is the policy's) and says, as data,
what differs for its family:

.. code-block:: python

    class MyDecoderPolicy(HFStages, Policy):
        first_ends = ("embed_tokens",)  # under the base model: only the first stage runs them
        last_ends = ("norm",)  # under the base model: only the last stage runs them
        heads = ("lm_head",)  # under the model: the head the last stage runs

The loss of a microbatch is its summed loss over the whole batch's number of terms
(``stage_loss``: ``"causal_lm"``, ``"masked_lm"`` or ``"classification"``), so the microbatches add
up to the unsharded model's mean loss.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...losses import classification_items, classification_loss, token_items, token_loss
from ...spec import PipelineSpec

__all__ = ["SEQ2SEQ_GENERATE_REFUSAL", "HFStages", "base_path", "seq2seq_stage_batch", "seq2seq_stage_output"]

#: the default of an input the batch leaves out, as the model itself would take it
_DEFAULTS = {
    "ones": lambda ids: torch.ones_like(ids),
    "zeros": lambda ids: torch.zeros_like(ids),
    "arange": lambda ids: torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1),
}


def base_path(model: nn.Module, base: nn.Module) -> str:
    """``"model."`` (the path of ``base`` inside ``model``, with its dot), or ``""`` when ``base`` is ``model``."""
    path = next(n for n, m in model.named_modules() if m is base)
    return f"{path}." if path else ""


def _present(module: nn.Module, path: str) -> bool:
    try:
        return module.get_submodule(path) is not None
    except AttributeError:  # optional (a pooler the model was built without)
        return False


def _unused(value) -> bool:
    """What ``generate()`` passes along that a forward without a cache can drop: nothing, ``False``, or an empty cache."""
    if value is None or value is False:
        return True
    return not isinstance(value, torch.Tensor) and hasattr(value, "__len__") and len(value) == 0


class HFStages:
    """The :class:`~shardcore.spec.PipelineSpec` of a HuggingFace model (see the module): :meth:`pipeline`."""

    #: why ``generate()`` cannot run through the stages (``None``: it can)
    stage_generate_refusal: str | None = None

    #: inputs besides ``input_ids`` that travel with the hidden states, each with its default
    #: (``"ones"``, ``"zeros"``, ``"arange"``) when the batch leaves it out
    stage_inputs: dict[str, str] = {"attention_mask": "ones", "position_ids": "arange"}
    #: inputs only the first stage takes (an image's pixels, which the first stage's vision tower
    #: reads): they do not travel; one the batch leaves out is an empty tensor (rows, 0) there
    stage_first_inputs: tuple[str, ...] = ()
    #: keyword arguments of every stage's call of the model (a decoder: no cache)
    stage_call: dict[str, Any] = {"use_cache": False}
    #: what a forward through the pipeline (``generate()``) may pass and the stages drop: the
    #: argument, and whether it is droppable only when unused (``True``) or always (``False``)
    stage_ignored: dict[str, bool] = {
        "use_cache": True,
        "past_key_values": True,
        "cache": True,  # transformers >= 5.24's name for past_key_values
        "token_type_ids": True,
        "cache_position": False,
        "return_dict": False,
    }
    #: modules under the base model only the first / the last stage runs
    first_ends: tuple[str, ...] = ()
    last_ends: tuple[str, ...] = ()
    #: position embeddings (under the base model) the model *adds* to the hidden states: zero on later stages
    zero_ends: tuple[str, ...] = ()
    #: the heads under the model the last stage runs; the first one present is used, none: no pipeline
    heads: tuple[str, ...] = ("lm_head",)
    #: ``"causal_lm"`` (the labels shifted inside the loss), ``"masked_lm"`` or ``"classification"``
    stage_loss: str = "causal_lm"
    #: the ``transformers.modeling_outputs`` class a forward through the pipeline returns
    stage_output: str = "CausalLMOutputWithPast"
    #: whether the blocks return ``(hidden, ...)`` (BLOOM's still do under transformers 5); ``None``:
    #: as transformers' major version says (:attr:`PipelineSpec.block_returns_tuple <shardcore.spec.PipelineSpec>`)
    stage_block_returns_tuple: bool | None = None

    def pipeline(self) -> PipelineSpec:
        """The stages on the model's own forward, from the data above."""
        return PipelineSpec(
            ends=self._pp_ends(),
            zero_ends=self._pp_zero_ends(),
            inputs=self._pp_inputs,
            stage_forward=self._pp_forward,
            output=self._pp_output,
            num_items=self._pp_num_items,
            loss=self._pp_loss,
            generate_refusal=self.stage_generate_refusal,
            block_returns_tuple=self.stage_block_returns_tuple,
            blocks=getattr(self, "stage_blocks", None),  # a composite: its language model's blocks
        )

    def _head(self) -> str:
        for head in self.heads:
            if isinstance(getattr(self.model, head, None), nn.Module):
                return head
        raise NotImplementedError(
            f"pipeline stages of {type(self).__name__} are built for models with a {' or '.join(self.heads)} "
            f"head, not {type(self.model).__name__}"
        )

    def _pp_ends(self) -> dict[str, str | int]:
        head, pre = self._head(), base_path(self.model, self.base)
        # optional modules (a projection or a pooler the model was built without) may be absent, at either end
        ends: dict[str, str | int] = {f"{pre}{name}": "first" for name in self.first_ends if _present(self.base, name)}
        ends.update({f"{pre}{name}": "last" for name in self.last_ends if _present(self.base, name)})
        ends[head] = "last"
        return ends

    def _pp_zero_ends(self) -> set[str]:
        pre = base_path(self.model, self.base)
        return {f"{pre}{name}" for name in self.zero_ends}

    def _pp_inputs(self, batch: dict, training: bool = True) -> tuple[tuple, Any]:
        batch = dict(batch)
        if not training:  # a None argument is the model's default: nothing to hand through
            batch = {k: v for k, v in batch.items() if v is not None}
        for key, only_unused in self.stage_ignored.items():  # a training step: what is unused only
            if key in batch and ((not training and not only_unused) or _unused(batch[key])):
                batch.pop(key)
        extra = sorted(set(batch) - {"input_ids", "labels", *self.stage_inputs, *self.stage_first_inputs})
        if extra or "input_ids" not in batch or (training and "labels" not in batch):
            what = "pipeline_step" if training else "a forward through the pipeline"
            raise ValueError(
                f"{what} ({type(self.model).__name__}) takes input_ids, "
                + ("labels, " if training else "")
                + f"and optionally {', '.join([*self.stage_inputs, *self.stage_first_inputs])}"
                + ("" if training else ", labels")
                + f"; got {sorted(batch)}"
                + (f" ({extra} not supported through pipeline stages)" if extra else "")
            )
        ids = batch["input_ids"]
        rest = [batch[k] if batch.get(k) is not None else _DEFAULTS[d](ids) for k, d in self.stage_inputs.items()]
        firsts = [
            batch[k] if batch.get(k) is not None else ids.new_zeros(ids.shape[0], 0) for k in self.stage_first_inputs
        ]
        return (ids, *rest, *firsts), batch.get("labels")

    def _pp_forward(self, inputs: tuple, *, first: bool, last: bool):
        tokens, *rest = inputs
        entry = {"input_ids": tokens} if first else {"inputs_embeds": tokens}
        if first and self.stage_first_inputs:  # the first stage's own inputs (an empty one: left out)
            rest, firsts = rest[: len(self.stage_inputs)], rest[len(self.stage_inputs) :]
            entry |= {k: v for k, v in zip(self.stage_first_inputs, firsts, strict=True) if v.numel()}
        kwargs = {**dict(zip(self.stage_inputs, rest, strict=True)), **self.stage_call}
        if last:  # the last stage is never the first: a pipeline has two stages at least
            return self.model(**entry, **kwargs).logits
        return (self.base(**entry, **kwargs).last_hidden_state, *rest)

    def _pp_num_items(self, labels):
        if self.stage_loss == "causal_lm":
            return (labels[..., 1:] != -100).sum()  # the shifted labels transformers' causal-LM loss counts
        if self.stage_loss == "masked_lm":
            return token_items(labels)
        return classification_items(self.model.config, labels)

    def _pp_loss(self, output, labels, num_items):
        if self.stage_loss == "causal_lm":
            config = self.model.config  # a composite's vocabulary is its text config's
            vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
            return self.model.loss_function(
                logits=output, labels=labels, vocab_size=vocab, num_items_in_batch=num_items
            )
        if self.stage_loss == "masked_lm":
            return token_loss(output, labels, num_items)
        return classification_loss(self.model.config, output, labels, num_items)

    def _pp_output(self, output, loss, *extra):
        from transformers import modeling_outputs

        return getattr(modeling_outputs, self.stage_output)(loss=loss, logits=output)


#: why ``generate()`` of an encoder-decoder cannot run through its stages (T5, Whisper)
SEQ2SEQ_GENERATE_REFUSAL = (
    "generate() of an encoder-decoder runs the encoder outside the model's forward, which the pipeline cannot route yet"
)


def seq2seq_stage_batch(model: nn.Module, batch: dict, training: bool, source: str, optional: tuple = ()) -> dict:
    """An encoder-decoder's batch for its pipeline stages, checked: it takes ``source`` (the encoder's
    input), ``labels`` (or ``decoder_input_ids``) and the ``optional`` keys; a training step needs
    labels. Returns the batch without its ``None`` values (and, in a forward through the pipeline,
    without ``return_dict`` / ``use_cache``)."""
    batch = {k: v for k, v in batch.items() if v is not None and (training or k not in ("return_dict", "use_cache"))}
    name = type(model).__name__
    allowed = {source, "labels", "decoder_input_ids", *optional}
    if set(batch) - allowed or source not in batch or not {"labels", "decoder_input_ids"} & set(batch):
        extra = f" and optionally {', '.join(optional)}" if optional else ""
        raise ValueError(
            f"pipeline stages of {name} take {source}, labels (or decoder_input_ids){extra}; got {sorted(batch)}"
        )
    if training and "labels" not in batch:
        raise ValueError(f"a pipeline training step of {name} needs labels")
    return batch


def seq2seq_stage_output(output, loss, encoder_output=None):
    """What a forward through an encoder-decoder's stages returns: the loss, the logits and the encoder's output."""
    from transformers.modeling_outputs import Seq2SeqLMOutput

    return Seq2SeqLMOutput(loss=loss, logits=output, encoder_last_hidden_state=encoder_output)
