"""shardcore plugin for GLM and GLM-4 (HuggingFace transformers), the in-library successors of ChatGLM.

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_glm.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_CLASSES = ("Model", "ForCausalLM", "ForSequenceClassification")
_FAMILIES = {"glm": "Glm", "glm4": "Glm4"}
#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    f"transformers.models.{module}.modeling_{module}.{prefix}{cls}": "shard_glm.policy:GlmPolicy"
    for module, prefix in _FAMILIES.items()
    for cls in _CLASSES
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
