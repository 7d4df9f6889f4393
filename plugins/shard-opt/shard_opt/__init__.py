"""shardcore plugin for OPT (HuggingFace transformers).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_opt.policy`` is imported only when a covered model is optimized.
"""

# --8<-- [start:register]
from shardcore import hookimpl

__version__ = "0.1.0"

_OPT = "transformers.models.opt.modeling_opt"
#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    f"{_OPT}.OPTModel": "shard_opt.policy:OPTPolicy",
    f"{_OPT}.OPTForCausalLM": "shard_opt.policy:OPTPolicy",
    f"{_OPT}.OPTForSequenceClassification": "shard_opt.policy:OPTPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)


# --8<-- [end:register]
