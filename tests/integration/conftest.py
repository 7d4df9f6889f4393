"""The core's integration tests: the core's features run end to end (real gloo ranks, HF's Trainer, PEFT,
torchrun, checkpoints, explain, plans, the examples) on a tiny Llama sharded by shard-llama. Their models
and batches are shard-llama's test cases (``plugins/shard-llama/tests/llama_cases.py``), put on the path
here (and so on every rank's, which starts from this process's); shard-llama's own tests are its policy's."""

from __future__ import annotations

import pathlib
import sys

#: where the tiny Llama's builders live (``llama_cases``)
LLAMA_CASES = pathlib.Path(__file__).resolve().parents[2] / "plugins" / "shard-llama" / "tests"
if str(LLAMA_CASES) not in sys.path:
    sys.path.insert(0, str(LLAMA_CASES))
