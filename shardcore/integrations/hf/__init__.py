"""HuggingFace glue: a sharded ``PreTrainedModel`` keeps working under the calls users make.

* ``save.py``: ``model.save_pretrained(d)`` on a sharded model writes the complete unsharded
  checkpoint (a collective: every rank calls it), which ``from_pretrained`` loads unsharded.
"""

from .save import install_save_pretrained

__all__ = ["install_save_pretrained"]
