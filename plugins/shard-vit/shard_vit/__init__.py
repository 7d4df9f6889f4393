"""shardcore plugin for vision transformers: HuggingFace ViT / DeiT and timm's VisionTransformer.

Importing this module is cheap and imports neither transformers nor timm: it registers policy
*locations*, and the policies themselves are structural (they read the model instance), so
sharding a timm model never imports transformers and vice versa.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

_HF = "transformers.models.{0}.modeling_{0}.{1}"
MODELS = {
    **{
        _HF.format("vit", c): "shard_vit.hf_policy:HFViTPolicy"
        for c in ("ViTModel", "ViTForImageClassification", "ViTForMaskedImageModeling")
    },
    **{_HF.format("deit", c): "shard_vit.hf_policy:HFViTPolicy" for c in ("DeiTModel", "DeiTForImageClassification")},
    "timm.models.vision_transformer.VisionTransformer": "shard_vit.timm_policy:TimmViTPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
