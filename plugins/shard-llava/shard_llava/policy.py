"""Tensor parallel for Llava: ``LlavaModel``, ``LlavaForConditionalGeneration``, as a composite.

Llava is a vision tower, a projector and a language model. Its two large parts are sharded by
the policies that cover their classes (:class:`shardcore.CompositePolicy`): the vision tower
(``CLIPVisionModel``) by shard-clip's, the language model (``LlamaModel``, or whatever
``text_config`` builds) by its plugin's, or by the plan its config ships where no plugin covers
it. Nothing of theirs is copied here. Llava's own modules: ``lm_head`` becomes a
vocabulary-parallel head (tied to the language model's vocabulary-parallel embedding when the
config ties them) gathering full logits, so the model's own loss and ``generate()`` run; the
``multi_modal_projector`` (two small linears) stays replicated.

Pipeline stages (``LlavaForConditionalGeneration``, :class:`~shardcore.integrations.hf.stages.HFStages`):
the language model's layers are cut into stages; the vision tower, the projector and the token
embedding run whole on the first stage, which merges the image features into the embeddings as
the model's own forward does (the pixels go to that stage only); later stages take the hidden
states as ``inputs_embeds``; the last runs the final norm and ``lm_head`` (tied to the embedding:
its gradient summed over the two stages).
"""

from __future__ import annotations

from shardcore import CompositePolicy, ModulePolicyDescription
from shardcore.plugin_api import HFStages, StageFacts, vocab_head

__all__ = ["LlavaPolicy"]


class LlavaPolicy(HFStages, CompositePolicy):
    # -- pipeline stages: the language model's layers; the vision tower whole on the first stage ------
    def stages(self):
        return StageFacts(
            first_inputs=("pixel_values",),
            first_ends=("vision_tower", "multi_modal_projector", "language_model.embed_tokens"),
            last_ends=("language_model.norm",),
            generate_refusal=(
                "generate() of Llava computes the image features outside the model's forward (mm_encoder_outputs), "
                "which the pipeline cannot route yet"
            ),
            blocks_under="language_model",  # the stages are cut from its layers (the vision tower is an end)
        )

    @property
    def base(self):
        return self.model.base_model  # LlavaModel

    def _path(self, module) -> str:
        return next(name for name, m in self.model.named_modules() if m is module)

    def parts(self):
        base = self.model.base_model  # LlavaModel under the generation head, or the model itself
        return [self._path(base.vision_tower), self._path(base.language_model)]

    def glue_policy(self):
        if not hasattr(self.model, "lm_head"):
            return {}
        return {
            type(self.model): ModulePolicyDescription(sub_module_replacement=[vocab_head("lm_head", self.shard_config)])
        }
