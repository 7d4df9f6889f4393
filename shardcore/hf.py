"""HuggingFace training with a sharded model: ``from shardcore.hf import Trainer`` (one changed import).

Importing this module imports ``transformers`` (and the Trainer imports ``accelerate``);
``import shardcore`` does not. See :mod:`shardcore.integrations.hf.trainer`.
"""

from .integrations.hf.trainer import Trainer

__all__ = ["Trainer"]
