"""Glue between a sharded model and the user's own tools (HuggingFace ``save_pretrained``, ...).

Nothing here imports a model library at import time.
"""
