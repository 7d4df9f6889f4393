"""shardcore plugin for Llava (HuggingFace transformers): a composite, its parts sharded by the
plugins covering them (the CLIP vision tower by shard-clip, the Llama by shard-llama).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_llava.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_LLAVA = "transformers.models.llava.modeling_llava"
#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    f"{_LLAVA}.LlavaModel": "shard_llava.policy:LlavaPolicy",
    f"{_LLAVA}.LlavaForConditionalGeneration": "shard_llava.policy:LlavaPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
