"""shardcore plugin for SAM, Segment Anything (HuggingFace transformers).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_sam.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {"transformers.models.sam.modeling_sam.SamModel": "shard_sam.policy:SamPolicy"}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
