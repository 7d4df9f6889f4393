"""Tensor parallel for Llava: ``LlavaModel``, ``LlavaForConditionalGeneration``, as a composite.

Llava is a vision tower, a projector and a language model. Its two large parts are sharded by
the policies that cover their classes (:class:`shardcore.CompositePolicy`): the vision tower
(``CLIPVisionModel``) by shard-clip's, the language model (``LlamaModel``, or whatever
``text_config`` builds) by its plugin's, or by the plan its config ships where no plugin covers
it. Nothing of theirs is copied here. Llava's own modules: ``lm_head`` becomes a
vocabulary-parallel head (tied to the language model's vocabulary-parallel embedding when the
config ties them) gathering full logits, so the model's own loss and ``generate()`` run; the
``multi_modal_projector`` (two small linears) stays replicated.
"""

from __future__ import annotations

from shardcore import CompositePolicy, ModulePolicyDescription
from shardcore.plugin_api import (
    vocab_head,
)

__all__ = ["LlavaPolicy"]


class LlavaPolicy(CompositePolicy):
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
