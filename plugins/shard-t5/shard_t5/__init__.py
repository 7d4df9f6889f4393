"""shardcore plugin for T5, MT5 and UMT5 (HuggingFace transformers).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_t5.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_CLASSES = ("Model", "ForConditionalGeneration", "EncoderModel")
_FAMILIES = {"t5": "T5", "mt5": "MT5", "umt5": "UMT5"}
#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    f"transformers.models.{module}.modeling_{module}.{prefix}{cls}": "shard_t5.policy:T5Policy"
    for module, prefix in _FAMILIES.items()
    for cls in _CLASSES
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
