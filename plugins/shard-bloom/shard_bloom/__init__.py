"""shardcore plugin for BLOOM (HuggingFace transformers).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_bloom.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_BLOOM = "transformers.models.bloom.modeling_bloom"
#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    f"{_BLOOM}.BloomModel": "shard_bloom.policy:BloomPolicy",
    f"{_BLOOM}.BloomForCausalLM": "shard_bloom.policy:BloomPolicy",
    f"{_BLOOM}.BloomForSequenceClassification": "shard_bloom.policy:BloomPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
