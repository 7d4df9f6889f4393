"""Pipeline stages of a HuggingFace model, on its own forward: one mixin every HF plugin shares.

A stage runs the model itself, pruned to its blocks (see :mod:`shardcore.pipeline`): the first
stage takes ``input_ids``, later stages take the previous stage's hidden states as
``inputs_embeds``, and the last calls the whole model so that its own head (and any scaling or
soft cap it applies) produces the logits. The small inputs every stage needs (the attention mask,
positions or token types) travel with the hidden states. A policy mixes :class:`HFStages` in
before :class:`~shardcore.Policy` (its :meth:`~HFStages.pipeline` is the policy's) and says what differs
for its family as one frozen value, :class:`StageFacts`, returned by its :meth:`~HFStages.stages`:

.. code-block:: python

    class MyDecoderPolicy(HFStages, Policy):
        def stages(self) -> StageFacts:
            return StageFacts(
                first_ends=("embed_tokens",),  # under the base model: only the first stage runs them
                last_ends=("norm",),  # under the base model: only the last stage runs them
                heads=("lm_head",),  # under the model: the head the last stage runs
            )

The loss of a microbatch is its summed loss over the whole batch's number of terms
(``StageFacts.loss``: ``"causal_lm"``, ``"masked_lm"`` or ``"classification"``), so the microbatches add
up to the unsharded model's mean loss.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...losses import classification_items, classification_loss, token_items, token_loss
from ...moved import stage_facts_of, warn_stage_attributes
from ...spec import PipelineSpec

__all__ = [
    "IGNORED",
    "SEQ2SEQ_GENERATE_REFUSAL",
    "HFStages",
    "StageFacts",
    "base_path",
    "seq2seq_stage_batch",
    "seq2seq_stage_output",
]

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


#: what a forward through the pipeline (``generate()``) may pass and the stages drop: the argument, and
#: whether it is droppable only when unused (``True``) or always (``False``)
IGNORED = {
    "use_cache": True,
    "past_key_values": True,
    "cache": True,  # transformers >= 5.24's name for past_key_values
    "token_type_ids": True,
    "cache_position": False,
    "return_dict": False,
}
_LOSSES = ("causal_lm", "masked_lm", "classification")


@dataclass(frozen=True)
class StageFacts:
    """What differs between HuggingFace families' pipeline stages, as one frozen value (a policy's
    :meth:`HFStages.stages` returns it; the module says how the stages use it):

    * ``first_ends`` / ``last_ends``: modules under the base model only the first / the last stage runs;
      ``zero_ends``: position embeddings (under the base model) the model *adds* to the hidden states:
      zero on later stages;
    * ``heads``: the heads under the model the last stage runs; the first one present is used;
    * ``inputs``: inputs besides ``input_ids`` that travel with the hidden states, each with its default
      (``"ones"``, ``"zeros"``, ``"arange"``) when the batch leaves it out; ``first_inputs``: inputs only
      the first stage takes (an image's pixels): they do not travel, and one left out is empty there;
    * ``call``: keyword arguments of every stage's call of the model (a decoder: no cache); ``ignored``:
      what a forward through the pipeline may pass and the stages drop (:data:`IGNORED`);
    * ``loss``: ``"causal_lm"`` (the labels shifted inside the loss), ``"masked_lm"`` or
      ``"classification"``; ``output``: the ``transformers.modeling_outputs`` class a forward returns;
    * ``block_returns_tuple``: whether the blocks return ``(hidden, ...)`` (``None``: as transformers'
      major version says, :attr:`PipelineSpec.block_returns_tuple <shardcore.spec.PipelineSpec>`);
    * ``generate_refusal``: why ``generate()`` cannot run through the stages (``None``: it can);
    * ``blocks_under``: a composite's part (its path under the base model) whose blocks the stages are
      cut from, the rest being ends (Llava's ``"language_model"``); ``None``: every block.
    """

    first_ends: tuple[str, ...] = ()
    last_ends: tuple[str, ...] = ()
    zero_ends: tuple[str, ...] = ()
    heads: tuple[str, ...] = ("lm_head",)
    inputs: Mapping[str, str] = field(default_factory=lambda: {"attention_mask": "ones", "position_ids": "arange"})
    first_inputs: tuple[str, ...] = ()
    call: Mapping[str, Any] = field(default_factory=lambda: {"use_cache": False})
    ignored: Mapping[str, bool] = field(default_factory=lambda: dict(IGNORED))
    loss: str = "causal_lm"
    output: str = "CausalLMOutputWithPast"
    block_returns_tuple: bool | None = None
    generate_refusal: str | None = None
    blocks_under: str | None = None

    def __post_init__(self) -> None:
        if self.loss not in _LOSSES:
            raise ValueError(f"StageFacts(loss={self.loss!r}): choose one of {_LOSSES}")
        unknown = {k: d for k, d in self.inputs.items() if d not in _DEFAULTS}
        if unknown:
            raise ValueError(f"StageFacts(inputs=...): the defaults {unknown} are not among {sorted(_DEFAULTS)}")
        for name in ("first_ends", "last_ends", "zero_ends", "heads", "first_inputs"):  # a tuple, not a string
            if isinstance(getattr(self, name), str):
                raise ValueError(f"StageFacts({name}={getattr(self, name)!r}): give a tuple of names")
        for name in ("inputs", "call", "ignored"):  # its own copies: the value is not changed through the caller's
            object.__setattr__(self, name, dict(getattr(self, name)))


class HFStages:
    """The :class:`~shardcore.spec.PipelineSpec` of a HuggingFace model (see the module): :meth:`pipeline`,
    from the :class:`StageFacts` its policy's :meth:`stages` returns."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        warn_stage_attributes(cls)  # 0.1's class attributes, still read (shardcore.moved)

    def stages(self) -> StageFacts:
        """This family's facts (override it; the default: a decoder with an ``lm_head``, or, for a policy
        written against 0.1, its class attributes read into the value)."""
        return stage_facts_of(self)

    def pipeline(self) -> PipelineSpec:
        """The stages on the model's own forward, from :meth:`stages` (asked once: each stage's functions
        are handed the value, not asking again per microbatch)."""
        facts = self.stages()
        return PipelineSpec(
            ends=self._pp_ends(facts),
            zero_ends=self._pp_zero_ends(facts),
            inputs=functools.partial(self._pp_inputs, facts),
            stage_forward=functools.partial(self._pp_forward, facts),
            output=functools.partial(self._pp_output, facts),
            num_items=functools.partial(self._pp_num_items, facts),
            loss=functools.partial(self._pp_loss, facts),
            generate_refusal=facts.generate_refusal,
            block_returns_tuple=facts.block_returns_tuple,
            blocks=functools.partial(self._pp_blocks, facts) if facts.blocks_under else None,
        )

    def _pp_blocks(self, facts: StageFacts) -> list:
        """The blocks of the part the stages are cut from (``StageFacts.blocks_under``)."""
        prefix = base_path(self.model, self.base) + facts.blocks_under + "."
        return [(name, block) for name, block in self.blocks() if name.startswith(prefix)]

    def _head(self) -> str:
        heads = self.stages().heads
        for head in heads:
            if isinstance(getattr(self.model, head, None), nn.Module):
                return head
        raise NotImplementedError(
            f"pipeline stages of {type(self).__name__} are built for models with a {' or '.join(heads)} "
            f"head, not {type(self.model).__name__}"
        )

    def _pp_ends(self, facts: StageFacts) -> dict[str, str | int]:
        head, pre = self._head(), base_path(self.model, self.base)
        # optional modules (a projection or a pooler the model was built without) may be absent, at either end
        ends: dict[str, str | int] = {f"{pre}{name}": "first" for name in facts.first_ends if _present(self.base, name)}
        ends.update({f"{pre}{name}": "last" for name in facts.last_ends if _present(self.base, name)})
        ends[head] = "last"
        return ends

    def _pp_zero_ends(self, facts: StageFacts) -> set[str]:
        pre = base_path(self.model, self.base)
        return {f"{pre}{name}" for name in facts.zero_ends}

    def _pp_inputs(self, facts: StageFacts, batch: dict, training: bool = True) -> tuple[tuple, Any]:
        batch = dict(batch)
        if not training:  # a None argument is the model's default: nothing to hand through
            batch = {k: v for k, v in batch.items() if v is not None}
        for key, only_unused in facts.ignored.items():  # a training step: what is unused only
            if key in batch and ((not training and not only_unused) or _unused(batch[key])):
                batch.pop(key)
        extra = sorted(set(batch) - {"input_ids", "labels", *facts.inputs, *facts.first_inputs})
        if extra or "input_ids" not in batch or (training and "labels" not in batch):
            what = "pipeline_step" if training else "a forward through the pipeline"
            raise ValueError(
                f"{what} ({type(self.model).__name__}) takes input_ids, "
                + ("labels, " if training else "")
                + f"and optionally {', '.join([*facts.inputs, *facts.first_inputs])}"
                + ("" if training else ", labels")
                + f"; got {sorted(batch)}"
                + (f" ({extra} not supported through pipeline stages)" if extra else "")
            )
        ids = batch["input_ids"]
        rest = [batch[k] if batch.get(k) is not None else _DEFAULTS[d](ids) for k, d in facts.inputs.items()]
        firsts = [batch[k] if batch.get(k) is not None else ids.new_zeros(ids.shape[0], 0) for k in facts.first_inputs]
        return (ids, *rest, *firsts), batch.get("labels")

    def _pp_forward(self, facts: StageFacts, inputs: tuple, *, first: bool, last: bool):
        tokens, *rest = inputs
        entry = {"input_ids": tokens} if first else {"inputs_embeds": tokens}
        if first and facts.first_inputs:  # the first stage's own inputs (an empty one: left out)
            rest, firsts = rest[: len(facts.inputs)], rest[len(facts.inputs) :]
            entry |= {k: v for k, v in zip(facts.first_inputs, firsts, strict=True) if v.numel()}
        kwargs = {**dict(zip(facts.inputs, rest, strict=True)), **facts.call}
        if last:  # the last stage is never the first: a pipeline has two stages at least
            return self.model(**entry, **kwargs).logits
        return (self.base(**entry, **kwargs).last_hidden_state, *rest)

    def _pp_num_items(self, facts: StageFacts, labels):
        if facts.loss == "causal_lm":
            return (labels[..., 1:] != -100).sum()  # the shifted labels transformers' causal-LM loss counts
        if facts.loss == "masked_lm":
            return token_items(labels)
        return classification_items(self.model.config, labels)

    def _pp_loss(self, facts: StageFacts, output, labels, num_items):
        if facts.loss == "causal_lm":
            config = self.model.config  # a composite's vocabulary is its text config's
            vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
            return self.model.loss_function(
                logits=output, labels=labels, vocab_size=vocab, num_items_in_batch=num_items
            )
        if facts.loss == "masked_lm":
            return token_loss(output, labels, num_items)
        return classification_loss(self.model.config, output, labels, num_items)

    def _pp_output(self, facts: StageFacts, output, loss, *extra):
        from transformers import modeling_outputs

        return getattr(modeling_outputs, facts.output)(loss=loss, logits=output)


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
