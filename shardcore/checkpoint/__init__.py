"""Checkpoints of sharded models.

* ``safetensors_io.py``: the safetensors format (positioned reads, streamed writes);
* ``hf.py`` / ``hf_save.py``: :func:`load_checkpoint` / :func:`save_checkpoint`, HuggingFace-format
  directories read slice by slice and written tensor by tensor;
* ``materialize.py``: turning a meta-built model real as its tensors arrive;
* ``dcp.py``: :func:`save_distributed` / :func:`load_distributed`, ``torch.distributed.checkpoint``
  of model and optimizer, resharded on load.
"""

from .dcp import load_distributed, save_distributed
from .hf import load_checkpoint
from .hf_save import save_checkpoint
from .safetensors_io import CheckpointError

__all__ = ["CheckpointError", "load_checkpoint", "load_distributed", "save_checkpoint", "save_distributed"]
