"""``shardcore.cost.tracked``: one rank's memory through two training steps, measured at real shapes
on the fake process-group backend with the tensors under ``FakeTensorMode`` (nothing allocated),
beside ``explain``'s prediction for the same rank. Each layout runs in a fresh process (the fake
world is the process's one ``torch.distributed`` world)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, warnings
warnings.filterwarnings("ignore")
import torch, shardcore
import transformers
from shardcore.cost.tracked import memory_check

def builder(kind):
    def build():
        own = {{"num_local_experts": 8, "num_experts_per_tok": 2}} if kind == "Mixtral" else {{}}
        cfg = getattr(transformers, kind + "Config")(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                                   num_attention_heads=8, num_key_value_heads=4, vocab_size=1024, **own)
        cfg._attn_implementation = "sdpa"
        with shardcore.init_empty():
            return getattr(transformers, kind + "ForCausalLM")(cfg).to(torch.bfloat16)
    return build

for config, batch, rank, kind in {cases}:  # one process: each check leaves torch.distributed as it found it
    print(json.dumps(memory_check(builder(kind), shardcore.ShardConfig(**config), seq=512, batch=batch, rank=rank)))
"""
CASES = [
    ({"tensor_parallel_size": 2}, 1, 0, "Llama"),
    ({"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"}, 2, 0, "Llama"),
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "num_microbatches": 2}, 2, 2, "Llama"),
    # transformers' batched experts keep a row per choice of every token on each rank, its experts or not
    ({"tensor_parallel_size": 2}, 1, 0, "Mixtral"),
    # the simulated rank routes its tokens' choices evenly over every expert (no data to count them by)
    (
        {"tensor_parallel_size": 1, "expert_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"},
        2,
        0,
        "Mixtral",
    ),
]
SHARES = [2, 4, None, None, None]  # of the whole (Llama) model's bytes the rank holds (a last stage: its own part)
IDS = ["tp2", "fsdp2-tp2", "pp2-tp2-last-stage", "mixtral-tp2", "mixtral-ep2-fsdp2"]
#: layouts whose activations explain does not model yet, and how far under the tracked it may be: expert
#: parallelism's dispatch buffers (the rows sent, received, sent back and laid out again, about ten rows
#: of the hidden width a choice at the peak; 21% under here, 24% for Mixtral-8x7B's shapes at EP=8)
NOT_MODELLED = {"mixtral-ep2-fsdp2": 0.25}


@pytest.fixture(scope="module")
def checks() -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(cases=CASES)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.strip().splitlines()[-len(CASES) :]]


LLAMA_BYTES = 2 * (1024 * 256 * 2 + 2 * (256 * 256 * 2 + 2 * 256 * 128 + 3 * 256 * 512) + 256 + 2 * 2 * 256)


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_a_simulated_rank_holds_what_explain_predicts_for_it(checks, case):
    """Parameters, gradients and AdamW's state measured on the rank equal explain's bytes for it (and
    1/share of the whole model's where the layout splits everything evenly but the norms); the
    activations and the peak are measured (the peak holds at least the parameters and AdamW's state)."""
    found, share = checks[case], SHARES[case]
    for key in ("parameters", "gradients", "optimizer"):
        row = found[key]
        assert row["measured"] == row["predicted"], f"{key}: measured {row['measured']} B, explain {row['predicted']} B"
    if share is not None:
        assert abs(found["parameters"]["measured"] - LLAMA_BYTES / share) <= 0.01 * LLAMA_BYTES, found["parameters"]
    assert found["optimizer"]["measured"] == 2 * found["parameters"]["measured"], "AdamW: 2 moments, the weights' dtype"
    assert found["activations"]["measured"] > 0 and found["activations"]["predicted"] > 0, found["activations"]
    # explain's activations and peak within 10% of the tracked (cost.facts: the head's gathered logits and the
    # loss's float32 copy, a pipeline's last stage's full-vocabulary loss, the norms' float32 inputs, FSDP's
    # gathered root unit and two blocks)
    for key in ("activations", "total"):
        row = found[key]
        if IDS[case] in NOT_MODELLED:  # measured, and the miss held to what it is now: never silently worse
            assert -NOT_MODELLED[IDS[case]] <= row["error"] <= 0.1, (
                f"explain's {key} {row['predicted']} B, {row['measured']} B"
            )
            continue
        assert abs(row["error"]) <= 0.1, f"explain's {key} {row['predicted']} B, {row['measured']} B tracked"
    floor = found["parameters"]["measured"] + found["optimizer"]["measured"]
    assert found["total"]["measured"] > floor, f"the tracked peak {found['total']['measured']} B below {floor} B"


def test_a_process_with_a_group_is_refused_by_name():
    code = (
        "import torch.distributed as dist, shardcore; from shardcore.distributed.simulate import init_simulated_world;"
        "init_simulated_world(0, 1);\nfrom shardcore.cost.tracked import tracked_memory\ntry:\n"
        "    tracked_memory(lambda: None, shardcore.ShardConfig(tensor_parallel_size=2), seq=8, batch=1)\n"
        "except RuntimeError as err:\n    print(err)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "a simulated rank needs a process of its own" in done.stdout, done.stdout + done.stderr[-2000:]
