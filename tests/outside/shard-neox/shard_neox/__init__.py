"""shardcore plugin for GPT-NeoX (HuggingFace transformers), published from outside shardcore's repository.

Importing this module is cheap: it registers policy *locations*; ``shard_neox.policy`` (and transformers
with it) is imported only when a GPT-NeoX model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_MODULE = "transformers.models.gpt_neox.modeling_gpt_neox"
#: model class -> policy location
MODELS = {f"{_MODULE}.{name}": "shard_neox.policy:NeoXPolicy" for name in ("GPTNeoXModel", "GPTNeoXForCausalLM")}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
