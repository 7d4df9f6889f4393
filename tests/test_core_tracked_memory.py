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

def builder(kind, layers, shape):
    def build():
        own = {{"num_local_experts": 8, "num_experts_per_tok": 2}} if kind == "Mixtral" else {{}}
        sizes = {{"hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024}} | shape
        cfg = getattr(transformers, kind + "Config")(num_hidden_layers=layers, num_attention_heads=8,
                                                   num_key_value_heads=4, **sizes, **own)
        cfg._attn_implementation = "sdpa"
        with shardcore.init_empty():
            return getattr(transformers, kind + "ForCausalLM")(cfg).to(torch.bfloat16)
    return build

for config, batch, rank, kind, layers, *shape in {cases}:  # one process: each leaves torch.distributed as it was
    shape = shape[0] if shape else {{}}
    print(json.dumps(memory_check(builder(kind, layers, shape), shardcore.ShardConfig(**config),
                                  seq=shape.pop("seq", 512), batch=batch, rank=rank)))
"""
CASES = [
    ({"tensor_parallel_size": 2}, 1, 0, "Llama", 2),
    # Megatron's split: the column-parallel layers' gathered input kept as the rank's slice, that tensor only (a
    # fake tensor's data pointer is 0, every one's: taken by it, every tensor saved was kept as a slice, 30% under)
    ({"tensor_parallel_size": 2, "enable_sequence_parallelism": True}, 1, 0, "Llama", 2),
    ({"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"}, 2, 0, "Llama", 2),
    # weights heavy beside a short sequence's activations (as Llama-3-70B's at 4096 tokens): the peak is in the
    # backward's second block from the end (the root and that block gathered, FSDP's buffers of three blocks, the
    # head's gradient), not at its start (explain 33% under on the activations, 11% on the peak, before its walk)
    (
        {"tensor_parallel_size": 2, "data_parallel_size": 4, "data_parallel": "hsdp", "data_parallel_shard_size": 2},
        4,
        0,
        "Llama",
        3,
        {"hidden_size": 1024, "intermediate_size": 3584, "vocab_size": 8192, "seq": 256},
    ),
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "num_microbatches": 2}, 2, 2, "Llama", 2),
    # a middle stage: three microbatches in flight, each stage handed an all-ones mask that a fake tensor cannot
    # show to be one (transformers would build the whole causal mask: 16% over what the rank holds in a real run)
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 4, "num_microbatches": 4}, 4, 2, "Llama", 4),
    # transformers' batched experts keep a row per choice of every token on each rank, its experts or not
    ({"tensor_parallel_size": 2}, 1, 0, "Mixtral", 2),
    # the simulated rank routes its tokens' choices evenly over every expert (no data to count them by)
    (
        {"tensor_parallel_size": 1, "expert_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"},
        2,
        0,
        "Mixtral",
        2,
    ),
]
# of the whole (Llama) model's bytes the rank holds (a stage: its own part; another shape's: None)
SHARES = [2, 2, 4, None, None, None, None, None]
IDS = [
    "tp2",
    "tp2-split_gather",
    "fsdp2-tp2",
    "hsdp2x2-tp2-peak-in-the-backward",
    "pp2-tp2-last-stage",
    "pp4-tp2-middle-stage",
    "mixtral-tp2",
    "mixtral-ep2-fsdp2",
]
#: layouts whose activations explain does not model yet, and how far under the tracked it may be: expert
#: parallelism's dispatch buffers (the rows sent, received, sent back and laid out again, about ten rows
#: of the hidden width a choice at the peak). 28% under here since explain walks FSDP's backward (16% before:
#: the walk's peak is in a block's backward, where those buffers are a larger share of what the rank holds;
#: the peak 7% under, as before), 12% for Mixtral-8x7B's shapes at EP=8
NOT_MODELLED = {"mixtral-ep2-fsdp2": 0.3}


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


def test_the_mask_builders_told_the_batch_is_unpadded_skip_the_mask_a_fake_tensor_would_make():
    """transformers takes a fake tensor for a trace and builds the whole causal mask from an all-ones padding mask,
    where a run reading the mask skips it (SDPA's ``is_causal``). Within the registry's ``unpadded`` the builders
    get no padding mask and skip it; the model's attention implementation and transformers' registries are as
    they were afterwards."""
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, create_causal_mask

    from shardcore.spec.attention import attention_registry

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg)
    with FakeTensorMode():
        embeds, ones = torch.zeros(1, 16, 32), torch.ones(1, 16, dtype=torch.long)
        traced = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=ones, cache=None)
        with attention_registry().unpadded(model):
            inside = model.config._attn_implementation
            told = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=ones, cache=None)
    assert traced is not None and tuple(traced.shape) == (1, 1, 16, 16), "a fake all-ones mask no longer builds one"
    assert told is None, f"told the batch is unpadded, the builder still made a {tuple(told.shape)} mask"
    assert inside != "sdpa", "the registry's unpadded left the model's attention implementation as it was"
    now = model.config._attn_implementation
    assert now == "sdpa", f"the model's attention implementation left as {now!r}, not 'sdpa'"
    assert inside not in ALL_MASK_ATTENTION_FUNCTIONS, f"{inside} left in transformers' mask registry"
