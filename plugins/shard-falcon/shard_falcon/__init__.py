"""shardcore plugin for Falcon (HuggingFace transformers).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_falcon.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_FALCON = "transformers.models.falcon.modeling_falcon"
#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    f"{_FALCON}.FalconModel": "shard_falcon.policy:FalconPolicy",
    f"{_FALCON}.FalconForCausalLM": "shard_falcon.policy:FalconPolicy",
    f"{_FALCON}.FalconForSequenceClassification": "shard_falcon.policy:FalconPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
