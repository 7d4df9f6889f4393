"""Llama in pipeline stages (torch.distributed.pipelining), alone and composed with TP: pipeline_step
trains like the unsharded model on the whole batch, with ragged label counts; errors come early."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import assert_pipeline_matches, count_c10d_calls, refusal_message, run_on_ranks

CFG = {"kv": 2, "tie": True, "layers": 4}  # GQA, tied embeddings (first and last stage), 4 blocks


def _batch() -> dict:
    batch = lm_batch(batch=4)  # row 0 left-padded
    batch["labels"][1, 4:] = -100  # ragged: the microbatches hold 8, 3, 11 and 11 label tokens
    return batch


def _check(pp: int, tp: int, schedule: str, extra: dict) -> dict:
    config = ShardConfig(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, num_microbatches=4, pipeline_schedule=schedule, **extra
    )
    with count_collectives() as counts:
        report = assert_pipeline_matches(lambda: build("LlamaForCausalLM", **CFG), _batch(), config)
    report["reduce_scatters"] = counts.get("reduce_scatter", 0)
    return report


@pytest.mark.parametrize(
    ("pp", "tp", "schedule", "extra"),
    [
        (2, 1, "GPipe", {}),
        (2, 1, "1F1B", {"pipeline_layers": [1, 3]}),  # an uneven split, as asked
        (2, 2, "1F1B", {}),  # PP=2 x TP=2 on 4 ranks
        (2, 1, "Interleaved1F1B", {}),  # 2 stages per rank, looped: rank 0 runs stages 0 and 2
        (2, 1, "ZBVZeroBubble", {}),  # 2 stages per rank in a V: rank 0 runs the first and the last
        # each stage splits the sequence at its first block and gathers it after its last
        (2, 2, "Interleaved1F1B", {"enable_sequence_parallelism": True}),
        (4, 1, "1F1B", {}),  # two middle stages: they receive activations and send them on
    ],
    ids=[
        "gpipe",
        "1f1b-layers13",
        "1f1b-tp2",
        "interleaved1f1b",
        "zbv",
        "interleaved1f1b-tp2-split_gather",
        "1f1b-pp4",
    ],
)
def test_pipeline_trains_like_unsharded(pp, tp, schedule, extra):
    reports = run_on_ranks(pp * tp, _check, pp, tp, schedule, extra)
    losses = {round(r["loss"], 7) for r in reports}
    assert len(losses) == 1, losses  # the same loss on every rank
    for r in reports:
        assert r["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in r, r
        assert (r["reduce_scatters"] > 0) == ("enable_sequence_parallelism" in extra), r
    if schedule in ("Interleaved1F1B", "ZBVZeroBubble"):
        stages = [[0, 2], [1, 3]] if schedule == "Interleaved1F1B" else [[0, 3], [1, 2]]
        assert [r["stages"] for r in reports] == [s for s in stages for _ in range(tp)]  # tp: the inner mesh dim


def _refused(extra: dict, layers: int = 4) -> str:
    return refusal_message(lambda: build("LlamaForCausalLM", **{**CFG, "layers": layers}), ShardConfig(**extra))


BAD = {
    "more stages than blocks": (
        {"pipeline_parallel_size": 2, "pipeline_schedule": "Interleaved1F1B", "pipeline_stages_per_rank": 3},
        "has 4 blocks, fewer than the 6 pipeline stages",
    ),
    "unknown schedule": (
        {"pipeline_parallel_size": 2, "pipeline_schedule": "Zigzag"},
        "pipeline_schedule='Zigzag' is not a schedule of this torch",
    ),
    "multi-stage schedule, one stage per rank": (
        {"pipeline_parallel_size": 2, "pipeline_schedule": "Interleaved1F1B", "pipeline_stages_per_rank": 1},
        "is a multi-stage schedule: it needs at least 2 stages per rank",
    ),
    "layers not summing": (
        {"pipeline_parallel_size": 2, "pipeline_layers": [1, 2]},
        "pipeline_layers=[1, 2]: give 2 numbers of blocks, each at least 1, summing to the model's 4 blocks",
    ),
    "zero bubble with data parallel": (
        {"pipeline_parallel_size": 2, "data_parallel": "fsdp", "pipeline_schedule": "InterleavedZeroBubble"},
        "pipeline_schedule='InterleavedZeroBubble', data_parallel='fsdp'): a zero-bubble schedule computes weight",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_pipeline_config_is_refused_on_every_rank(case):
    extra, expected = BAD[case]
    for message in run_on_ranks(2, _refused, extra):
        assert expected in message, f"{case}: refused with {message!r}"
    if case == "unknown schedule":
        assert "GPipe, 1F1B, Interleaved1F1B" in message  # the valid ones for this torch are listed


def _bad_step() -> dict:
    import shardcore

    torch.manual_seed(0)
    config = ShardConfig(pipeline_parallel_size=2, num_microbatches=4)
    model = shardcore.optimize(build("LlamaForCausalLM", **CFG), config)
    out = {}
    with count_c10d_calls() as calls:
        try:
            shardcore.pipeline_step(model, lm_batch(batch=6))
        except ValueError as err:
            out["step"] = str(err)
    out["calls"] = dict(calls)
    try:
        model(**lm_batch())
    except RuntimeError as err:
        out["forward"] = str(err)
    return out


def test_microbatches_not_dividing_the_batch_and_plain_forward_are_refused():
    for out in run_on_ranks(2, _bad_step):
        assert "batch size 6 is not divisible by num_microbatches=4" in out["step"], out
        assert out["calls"] == {}, out  # before any collective or send/recv
        assert "train it with shardcore.pipeline_step(model, batch)" in out["forward"], out


# -- checkpoints: a stage reads and writes only what it holds; names are the unsharded model's ------------

PP2 = {"pipeline_parallel_size": 2, "num_microbatches": 2}


def _dcp_save(path: str) -> None:
    from shardcore.testing import train_and_save

    batches = [_batch(), lm_batch(batch=4, seed=2)]
    train_and_save(lambda: build("LlamaForCausalLM", **CFG), batches, ShardConfig(**PP2), path)


def _dcp_resume(path: str, config: dict) -> float:
    from shardcore.testing import assert_resume_matches

    saved, rest = [_batch(), lm_batch(batch=4, seed=2)], [lm_batch(batch=4, seed=3)]
    return assert_resume_matches(lambda: build("LlamaForCausalLM", **CFG), saved, rest, ShardConfig(**config), path)


@pytest.mark.parametrize(
    ("world", "config"),
    [(1, {}), (2, {"tensor_parallel_size": 2}), (2, PP2)],
    ids=["pp1", "tp2", "pp2"],
)
def test_distributed_checkpoint_of_pp2_resumes_at_another_layout(world, config, tmp_path):
    run_on_ranks(2, _dcp_save, str(tmp_path / "dcp"))
    assert max(run_on_ranks(world, _dcp_resume, str(tmp_path / "dcp"), config)) <= 1e-5


def _hf_round_trip(ckpt: str, out: str) -> dict:
    import shardcore

    torch.manual_seed(0)
    ref = dict(build("LlamaForCausalLM", **CFG).named_parameters(remove_duplicate=False))
    with shardcore.init_empty():
        model = build("LlamaForCausalLM", **CFG)
    model = shardcore.optimize(model, ShardConfig(**PP2))
    with count_c10d_calls() as calls:
        shardcore.load_checkpoint(model, ckpt)  # reads this stage's tensors only: no collective
    worst = max((p.detach() - ref[n]).abs().max().item() for n, p in model.named_parameters())
    shardcore.save_checkpoint(model, out)
    torch.manual_seed(0)
    twin = build("LlamaForCausalLM", **CFG)
    loss = shardcore.pipeline_step(model, _batch())  # the stages built on meta train once loaded
    expected = twin(**_batch()).loss.item()
    return {
        "held": [n for n, _ in model.named_parameters()],
        "worst": worst,
        "calls": dict(calls),
        "loss": abs(loss.item() - expected) / expected,
    }


def test_hf_checkpoint_loads_per_stage_and_saves_whole(tmp_path):
    import json

    from shardcore.testing import assert_same_checkpoint

    torch.manual_seed(0)
    build("LlamaForCausalLM", **CFG).save_pretrained(tmp_path / "ref")
    first, last = run_on_ranks(2, _hf_round_trip, str(tmp_path / "ref"), str(tmp_path / "out"))
    assert first["worst"] == 0 and last["worst"] == 0 and first["calls"] == {} == last["calls"]
    assert first["loss"] <= 1e-6 and last["loss"] <= 1e-6, (first, last)
    assert not any(".layers.2." in n or ".layers.3." in n for n in first["held"])  # blocks 0-1: stage 0
    assert not any(".layers.0." in n or ".layers.1." in n for n in last["held"])
    assert "lm_head.weight" in last["held"]  # the tied head, under the unsharded model's name for it
    assert_same_checkpoint(str(tmp_path / "ref"), str(tmp_path / "out"))
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"]


# -- inference through the stages: model(...) and generate() ------------------------------------------------


def _infer(tp: int, schedule: str, num_beams: int, do_sample: bool) -> dict:
    import shardcore
    from shardcore.testing import assert_generate_matches

    cfg = {"kv": 2, "layers": 4, "vocab": 1001, "initializer_range": 0.1}  # untied: tokens that vary
    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", **cfg).eval()
    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=tp, pipeline_parallel_size=2, pipeline_schedule=schedule)
    model = shardcore.optimize(build("LlamaForCausalLM", **cfg), config).eval()
    batch = lm_batch(1001, seed=3)  # row 0 left-padded
    with torch.no_grad():
        got, want = model(**batch), ref(**batch)
    out = {
        "logits": (got.logits - want.logits).abs().max().item(),
        "loss": abs(got.loss.item() - want.loss.item()) / want.loss.item(),
    }
    args = {"max_new_tokens": 12, "num_beams": num_beams, "pad_token_id": 0}
    if do_sample:  # ranks seeded differently: sampling must still agree (and equal the reference, seeded alike)
        torch.manual_seed(5)
        with torch.no_grad():
            want = ref.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=True, **args
            )
        import torch.distributed as dist

        torch.manual_seed(5 if dist.get_rank() == 0 else 100 + dist.get_rank())
        with torch.no_grad():
            got = model.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=True, **args
            )
        out["tokens"] = got.tolist()
        out["sampled_equal"] = torch.equal(got, want)
    else:
        out["tokens"] = assert_generate_matches(
            ref, model, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=False, **args
        ).tolist()
    return out


@pytest.mark.parametrize(
    ("tp", "schedule", "num_beams", "do_sample"),
    [(1, "1F1B", 1, False), (1, "ZBVZeroBubble", 4, False), (2, "1F1B", 1, False), (1, "GPipe", 1, True)],
    ids=["greedy", "beam4-zbv", "greedy-tp2", "sampled"],
)
def test_forward_and_generate_through_the_pipeline(tp, schedule, num_beams, do_sample):
    """Logits and loss of a forward, greedy / beam tokens and scores of generate() (no KV cache:
    each step recomputes the sequence through the stages) equal to the unsharded model's, on
    every rank; sampling agrees across ranks seeded differently."""
    outs = run_on_ranks(2 * tp, _infer, tp, schedule, num_beams, do_sample)
    for out in outs:
        assert out["logits"] <= 1e-5 and out["loss"] <= 1e-6, out
        assert out["tokens"] == outs[0]["tokens"]
        assert out.get("sampled_equal", True), out


def _inference_only() -> dict:
    import shardcore

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", **CFG).eval()
    torch.manual_seed(0)
    config = ShardConfig(pipeline_parallel_size=2, inference_only=True)
    model = shardcore.optimize(build("LlamaForCausalLM", **CFG), config)
    batch = lm_batch()
    out = {"logits": (model(**batch).logits - ref(**batch).logits).abs().max().item()}  # no torch.no_grad()
    try:
        shardcore.pipeline_step(model, _batch())
    except RuntimeError as err:
        out["step"] = str(err)
    return out


def test_inference_only_runs_forward_and_refuses_training():
    for out in run_on_ranks(2, _inference_only):
        assert out["logits"] <= 1e-5, out
        assert "ShardConfig(inference_only=True): its parameters are frozen" in out.get("step", ""), out


def _other_head() -> str:
    return refusal_message(
        lambda: build("LlamaForSequenceClassification", **CFG), ShardConfig(pipeline_parallel_size=2)
    )


def test_a_head_without_pipeline_stages_is_refused_at_optimize():
    for message in run_on_ranks(2, _other_head):
        assert "LlamaForSequenceClassificationPolicy does not support pipeline parallelism" in message, message
        assert "LlamaForSequenceClassificationPolicy.pipeline() declares no PipelineSpec" in message, message
