"""shardcore plugin for GPT-2 (HuggingFace transformers).

Importing this module is cheap: it registers policy *locations*; ``shard_gpt2.policy`` is
imported only when a GPT-2 model is optimized (and is structural: it imports no transformers).
"""

from shardcore import hookimpl

__version__ = "0.1.0"

#: model class -> policy location
MODELS = {
    f"transformers.models.gpt2.modeling_gpt2.{cls}": "shard_gpt2.policy:GPT2Policy"
    for cls in ("GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification")
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
