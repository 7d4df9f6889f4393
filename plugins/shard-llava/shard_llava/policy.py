"""Tensor parallel for Llava: ``LlavaModel``, ``LlavaForConditionalGeneration``, as a composite.

Llava is a vision tower, a projector and a language model. Its two large parts are sharded by
the policies that cover their classes (:class:`shardcore.CompositePolicy`): the vision tower
(``CLIPVisionModel``) by shard-clip's, the language model (``LlamaModel``, or whatever
``text_config`` builds) by its plugin's, or by the plan its config ships where no plugin covers
it. Nothing of theirs is copied here. Llava's own modules: ``lm_head`` becomes a
vocabulary-parallel head (tied to the language model's vocabulary-parallel embedding when the
config ties them) gathering full logits, so the model's own loss and ``generate()`` run; the
``multi_modal_projector`` (two small linears) stays replicated.

Data parallelism with images on some ranks only: a rank whose part has none runs the vision tower
and projector on a blank image just before the language model, and adds zero times the result to
the language model's output (:func:`idle_image`, ``DataParallelSpec.idle_runs``): FSDP's vision
units gather and reduce on every rank alike, DDP's reducer gets every gradient, and the gradient
there is zero, the unsharded model's.

Pipeline stages (``LlavaForConditionalGeneration``, :class:`~shardcore.integrations.hf.stages.HFStages`):
the language model's layers are cut into stages; the vision tower, the projector and the token
embedding run whole on the first stage, which merges the image features into the embeddings as
the model's own forward does (the pixels go to that stage only); later stages take the hidden
states as ``inputs_embeds``; the last runs the final norm and ``lm_head`` (tied to the embedding:
its gradient summed over the two stages).
"""

from __future__ import annotations

import torch

from shardcore import CompositePolicy, ModulePolicyDescription
from shardcore.plugin_api import DataParallelSpec, HFStages, IdleRun, StageFacts, vocab_head

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

    # -- data parallelism: a rank whose part has no image still runs the vision tower (FSDP's units) ------
    def glue_specs(self):
        at = self._path(self.base.language_model)  # the tower's features are merged just before it runs
        idle = {"pixel_values": IdleRun(at, idle_image)}
        # with the idle run every step uses the same parameters; the tower's post_layernorm never (Llava reads
        # the hidden states, not the pooled output): DDP is told, where it would wait for their gradients
        spec = DataParallelSpec(idle_runs=idle, static_graph=True)
        return {**super().glue_specs(), "data_parallel": spec}

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


def idle_image(model) -> torch.Tensor:
    """The vision tower and projector run on one blank image of the config's size (the stand-in a
    data-parallel rank without images runs, :class:`~shardcore.plugin_api.DataParallelSpec`)."""
    base = model.base_model  # LlavaModel
    vision = base.config.vision_config
    weight = next(base.vision_tower.parameters())
    size = (1, vision.num_channels, vision.image_size, vision.image_size)
    out = base.get_image_features(pixel_values=torch.zeros(size, dtype=weight.dtype, device=weight.device))
    features = getattr(out, "pooler_output", out)  # transformers 5: the projected features per image
    return torch.cat([f.reshape(-1) for f in features])
