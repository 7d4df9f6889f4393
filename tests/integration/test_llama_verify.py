"""ShardConfig(verify=True) on a plugin's policy: the checks shardcore runs for plans it did not
write, asked for explicitly, pass on a correct policy (nothing refused, every gradient unsharded),
and with sequence parallelism the block check steps aside (a block alone would see the whole
sequence) while the first-step check runs."""

from __future__ import annotations

import logging

import pytest
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, run_on_ranks


def _check(tp: int, sequence: bool) -> dict:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("shardcore").addHandler(handler)
    extra = {"enable_sequence_parallelism": True} if sequence else {}
    try:
        report = assert_sharded_matches(
            lambda: build("LlamaForCausalLM", kv=2),
            lm_batch(),
            ShardConfig(tensor_parallel_size=tp, verify=True, **extra),
        )
    finally:
        logging.getLogger("shardcore").removeHandler(handler)
    return {"report": report, "log": records}


@pytest.mark.parametrize("sequence", [False, True], ids=["tp", "tp-split_gather"])
def test_verify_passes_a_correct_policy(sequence):
    for result in run_on_ranks(2, _check, 2, sequence):
        skipped = any("does not run with sequence parallelism" in m for m in result["log"])
        assert skipped == sequence, result["log"]
        assert not any("act on split activations" in m for m in result["log"]), result["log"]  # nothing to fix
