"""shardcore plugin for diffusion transformers from HuggingFace diffusers (DiT, PixArt-alpha / -sigma).

Importing this module must stay cheap: it registers policy *locations* and never imports diffusers;
``shard_diffusers.policy`` is imported only when a covered model is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

#: model class (``f"{cls.__module__}.{cls.__qualname__}"``) -> policy location
MODELS = {
    "diffusers.models.transformers.dit_transformer_2d.DiTTransformer2DModel": "shard_diffusers.policy:DiTPolicy",
    "diffusers.models.transformers.pixart_transformer_2d.PixArtTransformer2DModel": "shard_diffusers.policy:DiTPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
