"""shardcore plugin for mixture-of-experts decoders: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE
(HuggingFace transformers 5).

Importing this module is cheap: it registers policy *locations*; ``shard_moe.policy`` (and
transformers with it) is imported only when one of these models is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

#: transformers module name -> class-name prefix
FAMILIES = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "olmoe": "Olmoe"}
#: class-name suffix -> policy class in shard_moe.policy
HEADS = {"Model": "MoeModelPolicy", "ForCausalLM": "MoeForCausalLMPolicy"}
#: model class -> policy location
MODELS = {
    f"transformers.models.{module}.modeling_{module}.{prefix}{suffix}": f"shard_moe.policy:{policy}"
    for module, prefix in FAMILIES.items()
    for suffix, policy in HEADS.items()
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
