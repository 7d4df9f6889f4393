"""shardcore plugin for BLIP-2 (HuggingFace transformers): its vision encoder and Q-Former, and
BLIP-2 as a composite whose language model is sharded by the plugin covering it (shard-opt, shard-t5).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_blip2.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_BLIP2 = "transformers.models.blip_2.modeling_blip_2"
#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    f"{_BLIP2}.Blip2ForConditionalGeneration": "shard_blip2.policy:Blip2Policy",
    f"{_BLIP2}.Blip2Model": "shard_blip2.policy:Blip2Policy",
    f"{_BLIP2}.Blip2VisionModel": "shard_blip2.policy:Blip2VisionPolicy",
    f"{_BLIP2}.Blip2QFormerModel": "shard_blip2.policy:Blip2QFormerPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
