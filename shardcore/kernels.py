"""Kernel choices behind ``ShardConfig``'s optimization switches (attention backend, fused
normalization, JIT-fused elementwise ops), decided per device and dtype, with clean fallbacks.

Nothing here imports a model library at import time; the HuggingFace attention registry is
touched only when a HuggingFace model asks for it (:func:`use_hf_attention`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import torch

__all__ = ["FLASH_DTYPES", "attention_backend", "flash_attn_available"]

log = logging.getLogger("shardcore")

#: dtypes flash-attn 2 computes in.
FLASH_DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def flash_attn_available() -> bool:
    """Whether the ``flash_attn`` package (2.x) is importable (``pip install shardcore[flash]``)."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        from importlib.metadata import version

        return int(version("flash-attn").split(".")[0]) >= 2
    except Exception:  # metadata missing or unparsable: the import is what counts
        return True


def attention_backend(device: torch.device | str, dtype: torch.dtype, *, flash: bool | None = None) -> str:
    """The attention backend ``enable_flash_attention=True`` runs for tensors on ``device`` in ``dtype``.

    ``"flash_attention_2"`` when ``flash_attn`` is installed (``flash``: override the probe) and
    the tensors are CUDA fp16/bf16; otherwise ``"sdpa"``
    (``torch.nn.functional.scaled_dot_product_attention``, fused kernels on CPU and CUDA).
    """
    device = torch.device(device)
    flash = flash_attn_available() if flash is None else flash
    if flash and device.type == "cuda" and dtype in FLASH_DTYPES:
        return "flash_attention_2"
    return "sdpa"
