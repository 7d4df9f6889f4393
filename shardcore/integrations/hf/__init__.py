"""HuggingFace glue: a sharded ``PreTrainedModel`` keeps working under the calls users make.

* ``save.py``: ``model.save_pretrained(d)`` on a sharded model writes the complete unsharded
  checkpoint (a collective: every rank calls it), which ``from_pretrained`` loads unsharded.
* ``attention.py``: transformers' attention registry, through which policies switch a model's
  attention (flash, SDPA, the sequence-parallel modes); registered with the core on import.
"""

from . import attention  # noqa: F401 (registers transformers' attention registry with the core)
from .save import install_save_pretrained

__all__ = ["install_save_pretrained"]
