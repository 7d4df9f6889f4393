"""The model library's attention registry: the default way a policy's attention is switched.

Set by that library's integration (HuggingFace's: :mod:`shardcore.integrations.hf.attention`, registered when
shardcore is imported); a spec whose attention fields are ``None`` (:class:`~shardcore.spec.KernelSpec`,
:class:`~shardcore.spec.SequenceSpec`) goes through it. The core knows no library.
"""

from __future__ import annotations

#: the registered registry (one)
_REGISTRY: list = []


def register_attention_registry(registry) -> None:
    """Make ``registry`` (an object with ``switchable(model)``, ``use(model, backend)``,
    ``sequence_problem(model, mode, routed=False)``, ``use_sequence(model, mode, routed=False)`` and
    ``module``, where the library's functions live) the one policies switch attention through. Optional:
    ``unpadded(model)``, a context in which the model's mask builders take the batch as unpadded (a simulated
    rank's, whose fake tensors cannot be read: :mod:`shardcore.cost.tracked`).
    ``routed``: the policy vouches that the model's attention reads the registry at each call
    (:attr:`SequenceSpec.routed <shardcore.spec.SequenceSpec>`)."""
    _REGISTRY[:] = [registry]


def attention_registry():
    """The registered attention registry (see :func:`register_attention_registry`)."""
    if not _REGISTRY:
        raise NotImplementedError(
            "no model library's attention registry is registered: import shardcore (its HuggingFace "
            "integration registers transformers'), or override the policy's attention methods"
        )
    return _REGISTRY[0]
