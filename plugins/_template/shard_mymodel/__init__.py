"""shardcore plugin for MyModel (mymodels).

Importing this module must stay cheap: it registers policy *locations* and never imports the
model library; ``shard_mymodel.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    "mymodels.modeling.MyModel": "shard_mymodel.policy:MyModelPolicy",
    "mymodels.modeling.MyModelForCausalLM": "shard_mymodel.policy:MyModelPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
