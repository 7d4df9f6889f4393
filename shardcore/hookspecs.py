"""The plugin contract: the hooks a shardcore plugin may implement.

A plugin is a distribution with an entry point in group ``"shardcore"``, e.g.::

    [project.entry-points.shardcore]
    llama = "shard_llama"

pointing at a module whose functions are marked with :data:`hookimpl`. Importing that module
must be cheap: it must not import the model library (transformers, timm) at top level.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

NAME = "shardcore"

hookspec = pluggy.HookspecMarker(NAME)
hookimpl = pluggy.HookimplMarker(NAME)

#: ``register(model_qualname, policy)`` or ``register({model_qualname: policy, ...})``, as passed
#: to :func:`shardcore_register_policies`.
Register = Callable[..., None]


@hookspec
def shardcore_register_policies(register: Register) -> None:
    """Register the sharding policies this plugin provides.

    Called once, when shardcore first needs a policy or lists plugins.

    :param register: call ``register(MODELS)`` with a ``{model_qualname: policy}`` mapping (the
        idiom every shardcore plugin uses), or ``register(model_qualname, policy)`` once per
        model class covered.
        ``model_qualname`` is ``f"{cls.__module__}.{cls.__qualname__}"`` of the model class, e.g.
        ``"transformers.models.llama.modeling_llama.LlamaForCausalLM"``; subclasses of it match
        too. ``policy`` is a :class:`shardcore.Policy` subclass or, preferably, its location
        ``"package.module:PolicyClass"``, imported only when a matching model is optimized.

    .. versionadded:: 0.1
    """
