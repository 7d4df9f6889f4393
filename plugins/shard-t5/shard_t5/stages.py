"""Pipeline stages of T5, MT5 and UMT5 (``*ForConditionalGeneration``) on the model's own forward.

Encoder and decoder blocks are one list cut into stages, as Shardformer's ``decoder_starting_stage``
cuts them. The shared token embedding runs on the first stage (the encoder's ids and the
decoder's, so later stages receive only floating-point states), each stack's final norm with its
last block, the head on the last stage; tied to the embedding, its gradient is summed over the
two stages.

T5's relative position bias is computed by the first block of each stack and handed by the
stack to the blocks after it. A stage that starts a stack mid-way receives it from the stage
before (an activation: its gradient flows back to the first stage's bias table), and its first
block takes it where the stack would have handed it. The blocks a stage does not hold are holes
that hand the biases on unchanged (``PipelineSpec.block_returns_tuple=(0, 2, 5)``). UMT5's blocks
compute their own bias each: nothing is handed. Cross-attention's bias is zero in every T5 (no
bias table), so each stage's first decoder block makes it, as the first one does.

What travels between stages, per microbatch:

* in the encoder: ``(encoder states, attention mask, position bias, decoder embeddings)``;
* at the encoder's end: ``(encoder output, attention mask, decoder embeddings)``;
* in the decoder: ``(encoder output, attention mask, decoder states, position bias)``: the encoder
  output reaches every decoder stage (cross-attention) and its gradient flows back through them.

(T5's bias only where the family hands it.) A stage entered mid-stack runs the stack's own forward
with its first held block taking the states in (a forward pre-hook, which also undoes the stack's
input dropout, applied where the stack starts), and its last held block's output handed on (a
forward hook). Built for transformers 5 (under transformers 4 the blocks fold the mask into the
bias and return it in another tuple).
"""

from __future__ import annotations

from torch import nn

from shardcore.plugin_api import (
    SEQ2SEQ_GENERATE_REFUSAL,
    PipelineHole,
    PipelineSpec,
    seq2seq_stage_batch,
    seq2seq_stage_output,
    token_items,
    token_loss,
)

__all__ = ["T5Stages"]


def _held(stack: nn.Module) -> list[nn.Module]:
    return [b for b in stack.block if not isinstance(b, PipelineHole)]


class T5Stages:
    """The pipeline part of :class:`~shard_t5.policy.T5Policy` (see the module)."""

    def pipeline(self) -> PipelineSpec:
        return PipelineSpec(
            ends=self._pp_ends(),
            inputs=self._pp_inputs,
            stage_forward=self._pp_stage_forward,
            output=seq2seq_stage_output,
            num_items=token_items,
            loss=lambda output, labels, num_items: token_loss(output[0], labels, num_items),
            block_returns_tuple=(0, 2, 5) if self._hands_bias() else False,
            generate_refusal=SEQ2SEQ_GENERATE_REFUSAL,  # generate() runs the encoder outside the forward
        )

    def _encoder_decoder(self) -> list[nn.Module]:
        name = type(self.model).__name__
        stacks = self._stacks()
        if not isinstance(getattr(self.model, "lm_head", None), nn.Module) or len(stacks) != 2:
            raise NotImplementedError(
                f"pipeline stages are built for the T5 family's *ForConditionalGeneration, not {name}"
            )
        import transformers  # the model is a transformers model: it is imported already

        if int(transformers.__version__.split(".")[0]) < 5:
            raise NotImplementedError(
                f"{name}: pipeline stages are built for transformers >= 5 (under {transformers.__version__} T5's "
                "blocks fold the attention mask into the position bias they hand on)"
            )
        return stacks

    def _hands_bias(self) -> bool:
        """Whether the stacks hand the first block's position bias on (T5, MT5), or every block has its
        own (UMT5). Read once, off the whole model (later, its blocks may be holes)."""
        if "_t5_hands_bias" not in self.__dict__:
            stack = self._encoder_decoder()[0]
            self._t5_hands_bias = not any(
                getattr(b.layer[0].SelfAttention, "has_relative_attention_bias", False) for b in stack.block[1:]
            )
        return self._t5_hands_bias

    def _pp_ends(self) -> dict[str, str | int]:
        encoder, decoder = self._encoder_decoder()
        paths = {id(m): n for n, m in self.model.named_modules(remove_duplicate=False)}
        embeddings = {n for n, m in self.model.named_modules(remove_duplicate=False) if m is encoder.embed_tokens}
        embeddings |= {n for n, m in self.model.named_modules(remove_duplicate=False) if m is decoder.embed_tokens}
        enc, dec = paths[id(encoder)], paths[id(decoder)]
        if isinstance(getattr(self.model, "shared", None), nn.Module):
            embeddings.add("shared")
        return {
            **dict.fromkeys(sorted(embeddings), "first"),  # shared, each stack's embed_tokens: one module or tied
            f"{enc}.final_layer_norm": len(encoder.block) - 1,  # with the last encoder block
            f"{dec}.final_layer_norm": "last",
            "lm_head": "last",
        }

    def _pp_inputs(self, batch: dict, training: bool = True) -> tuple[tuple, object]:
        batch = seq2seq_stage_batch(self.model, batch, training, "input_ids", ("attention_mask",))
        ids, labels = batch["input_ids"], batch.get("labels")
        mask = batch.get("attention_mask")
        mask = mask if mask is not None else ids.new_ones(ids.shape)
        decoder_ids = batch.get("decoder_input_ids")
        if decoder_ids is None:  # as the model's forward does: the labels shifted right after the start token
            decoder_ids = self.model._shift_right(labels)
        return (ids, mask, decoder_ids), labels

    def _pp_stage_forward(self, inputs: tuple, *, first: bool, last: bool):
        encoder, decoder = self._encoder_decoder()
        hands = self._hands_bias()
        if _held(encoder):
            if first:
                x, mask, decoder_ids = inputs
                y, bias = decoder.embed_tokens(decoder_ids), None  # as the decoder would: inputs_embeds
            else:
                x, mask, *bias, y = inputs
                bias = bias[0] if bias else None
            x, bias = self._run(encoder, x, bias, first, input_ids=x, attention_mask=mask)
            if bias is not False:  # the encoder goes on in the next stage
                return (x, mask, *([bias] if hands else []), y)
            bias = None
        else:
            x, mask, y, *bias = inputs
            bias = bias[0] if bias else None
        if not _held(decoder):
            return x, mask, y
        if last:  # the model's own forward from the encoder's output: the decoder, its scaling and head
            from transformers.modeling_outputs import BaseModelOutput

            run = self.model
            kwargs = {"encoder_outputs": BaseModelOutput(last_hidden_state=x), "attention_mask": mask}
            kwargs["decoder_inputs_embeds"] = y
        else:
            run, kwargs = decoder, {"inputs_embeds": y, "encoder_hidden_states": x, "encoder_attention_mask": mask}
        out, bias = self._run(decoder, y, bias, False, call=run, use_cache=False, **kwargs)
        # the last stage: the logits, and the encoder output the model returns too (a forward through the stages)
        return (out.logits, x) if last else (x, mask, out, *([bias] if hands else []))

    def _run(self, stack: nn.Module, x, bias, first: bool, *, call=None, input_ids=None, **kwargs):
        """The model's own forward over this stage's blocks of ``stack``: ``(its output, False)`` when
        the stack ends here (``call``'s output, or the stack's), else ``(the last held block's states,
        the bias it hands on)``. A stack entered mid-way takes ``x`` (and ``bias``) in at its first held block."""
        held = _held(stack)
        caught = {}

        def enter(module, args, kw):
            args = (x, *args[1:])  # the states handed in, not the stack's input dropout of them
            if bias is not None:
                args = (*args[:2], bias, *args[3:])
            return args, kw

        def leave(module, args, out):
            caught["out"] = out

        handles = [held[-1].register_forward_hook(leave)]
        starts = held[0] is stack.block[0]
        if not starts:
            handles.append(held[0].register_forward_pre_hook(enter, with_kwargs=True))
        try:
            if call is None:
                entry = {"input_ids": input_ids} if first else {"inputs_embeds": x}
                out = stack(**entry, **kwargs)
            else:
                out = call(**kwargs)
        finally:
            for handle in handles:
                handle.remove()
        if not isinstance(stack.final_layer_norm, PipelineHole):  # the stack ends on this stage
            return (out if call is not None and call is not stack else out.last_hidden_state), False
        out = caught["out"]
        return (out[0], out[1]) if isinstance(out, tuple) else (out, None)
