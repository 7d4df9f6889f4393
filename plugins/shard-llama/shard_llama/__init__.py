"""shardcore plugin for the Llama architecture: Llama, Mistral and Qwen2 (HuggingFace transformers).

Importing this module is cheap: it registers policy *locations*; ``shard_llama.policy`` (and
transformers with it) is imported only when one of these models is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

#: transformers module name -> class-name prefix; all share Llama's module layout.
FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}
#: class-name suffix -> policy class in shard_llama.policy
HEADS = {
    "Model": "LlamaModelPolicy",
    "ForCausalLM": "LlamaForCausalLMPolicy",
    "ForSequenceClassification": "LlamaForSequenceClassificationPolicy",
}
#: model class -> policy location
MODELS = {
    f"transformers.models.{module}.modeling_{module}.{prefix}{suffix}": f"shard_llama.policy:{policy}"
    for module, prefix in FAMILIES.items()
    for suffix, policy in HEADS.items()
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
