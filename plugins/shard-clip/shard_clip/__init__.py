"""shardcore plugin for CLIP (HuggingFace transformers): its vision and text towers, alone or
together, and as the vision tower of a vision-language model (shard-llava delegates to it).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_clip.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_CLIP = "transformers.models.clip.modeling_clip"
_CLASSES = (
    "CLIPModel",
    "CLIPVisionModel",
    "CLIPTextModel",
    "CLIPVisionModelWithProjection",
    "CLIPTextModelWithProjection",
)
#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {f"{_CLIP}.{name}": "shard_clip.policy:CLIPPolicy" for name in _CLASSES}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
