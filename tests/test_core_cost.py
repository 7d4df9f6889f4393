"""``shardcore calibrate``: this machine measured once (matmul throughput, each collective's
latency and bandwidth, memory per rank) into a cached JSON profile."""

from __future__ import annotations

import json
import platform
import time

import attrs
import pytest

from shardcore.cli import main
from shardcore.cost import KINDS, collective_seconds, fit_line, load_profile
from shardcore.cost.facts import StageFacts, stage_facts
from shardcore.cost.model import LOSS_PASSES, communication, optimizer_rate, optimizer_seconds, predict, shape_factor
from shardcore.cost.schedule import one_f_one_b


def test_the_line_fit_recovers_latency_and_bandwidth():
    points = [(n, 2e-5 + n / 3e9) for n in (4096, 65536, 1 << 20, 1 << 22)]
    latency, bandwidth = fit_line(points)
    assert latency == pytest.approx(2e-5, rel=1e-6) and bandwidth == pytest.approx(3e9, rel=1e-6)
    assert fit_line([(10, 1.0), (20, 0.5)])[0] >= 0  # noise that slopes down: clamped, never negative


@pytest.mark.slow  # measures this machine: nox -s tests-slow
def test_calibrate_measures_once_and_caches(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHARDCORE_CACHE", str(tmp_path))
    start = time.perf_counter()
    assert main(["calibrate", "--world", "2", "--json"]) == 0
    captured = capsys.readouterr()
    first = json.loads(captured.out)
    for stage in ("matmul rates", "collectives over 2 ranks", "each of 2 ranks' compute", "done: "):
        assert f"]: {stage}" in captured.err, f"calibrate did not announce {stage!r}: {captured.err}"
    print(f"calibrate took {time.perf_counter() - start:.1f} s")  # reported, not asserted: a busy machine is slower
    assert first["path"].startswith(str(tmp_path)) and first["backend"] == "gloo"
    assert set(first["matmul_flops"]) == {"float32", "bfloat16"} and min(first["matmul_flops"].values()) > 1e6
    assert first["memory_bytes_per_rank"] > 0
    for kind in KINDS:
        fit = first["collectives"][kind]["2"]
        assert fit["latency_s"] >= 0 and fit["bytes_per_s"] > 0, (kind, fit)
        # the line describes what was measured, in relative error as it is fit: within 50% at the
        # median point (not at every point: past the caches, at 16 MiB, a message may take 2-4x its
        # share of the line, which the cost model meets by interpolating the points themselves)
        off = sorted(abs(fit["latency_s"] + n / fit["bytes_per_s"] - t) / t for n, t in fit["points"])
        assert off[len(off) // 2] < 0.5, (kind, fit)
    mine = first["per_rank"]["2"]  # what a rank achieves with both at work
    assert min(mine["block_flops"].values()) > 1e6 and mine["copy_bytes_per_s"] > 1e6
    loss = mine["loss_elements_per_s"]  # a cross-entropy's forward and backward, per logit, by the logits' elements
    sizes = {str(rows * 8192) for rows in (128, 512, 2048, 4096)}
    assert set(loss) == sizes, f"the loss timed at {sorted(loss)} logits, not at each of {sorted(sizes)}"
    assert min(loss.values()) > 1e6, loss
    for shapes in mine["block_shapes"].values():  # a rank's block per TP degree and tokens per microbatch
        assert set(shapes) == {"1", "2", "4"} and all(set(t) == {"32", "128", "512"} for t in shapes.values())
        assert all(0.05 < f < 5 for t in shapes.values() for f in t.values()), shapes
        # the reference shape (2 x 256 tokens, TP=1) is one of them: its factor exactly 1
        assert shapes["1"]["512"] == 1.0, f"the reference shape's factor is {shapes['1']['512']}, not 1: {shapes}"
    for dtype, attention in mine["attention_shapes"].items():  # the attention's rate over the block's, by head dim
        assert set(attention["full"]) == set(attention["causal"]) == {"32", "64", "128"}, attention
        assert all(0.01 < f < 10 for m in ("full", "causal") for f in attention[m].values()), attention
        assert 0.01 < attention["reference"] < 10 and attention["share"] == pytest.approx(1 / 13), attention
        # the masked half counts half the FLOPs; no kernel runs it more than twice as fast per counted FLOP
        slower = [attention["causal"][d] / attention["full"][d] for d in ("32", "64", "128")]
        assert all(0.2 < r < 1.5 for r in slower), f"{dtype}: causal over full attention per counted FLOP: {slower}"
    elementwise = mine["elementwise_bytes_per_s"]  # the chain's traced bytes per second, by its bytes per op
    assert len(elementwise) == 4 and min(elementwise.values()) > 1e6, elementwise
    assert set(mine["fresh_bytes_per_s"]) == {"8", "30", "34", "96"}  # a buffer just allocated, per size (MiB)
    fresh = mine["fresh_bytes_per_s"]
    assert min(fresh.values()) > 1e6
    if platform.libc_ver()[0] == "glibc":  # its allocator maps a buffer over 32 MiB anew: here 3-6x slower to write
        assert fresh["34"] < 0.75 * fresh["30"], f"a buffer over the allocator's threshold written as fast: {fresh}"
    else:  # another allocator: its threshold, if any, unknown here
        print(f"not glibc ({platform.libc_ver()}): the fresh-buffer rates are not compared: {fresh}")
    for name in ("adamw", "sgd"):  # per tensor size (MiB): small tensors update from cache
        assert set(mine["optimizer_bytes_per_s"][name]) == {"1", "4", "32"}
        assert min(mine["optimizer_bytes_per_s"][name].values()) > 1e6
    again = load_profile()  # cached: the same profile, nothing measured
    assert again["seconds"] == first["seconds"] and again["collectives"] == first["collectives"]
    assert main(["calibrate", "--world", "2"]) == 0
    assert "latency" in capsys.readouterr().out


def test_calibrate_refuses_a_group_of_one(tmp_path, capsys):
    assert main(["calibrate", "--world", "1", "--out", str(tmp_path / "p.json")]) == 1
    assert "group size 1 must be at least 2" in capsys.readouterr().err


def test_no_profile_inside_a_job_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="shardcore calibrate --world 2"):
        load_profile(tmp_path / "absent.json", measure=False)


def test_the_cost_model_reads_the_profile_where_it_was_measured():
    fit = {"latency_s": 1e-3, "bytes_per_s": 1e9}
    profile = {
        "collectives": {"all_reduce": {"2": fit, "4": {**fit, "latency_s": 4e-3}, "2@4": {**fit, "latency_s": 2e-3}}},
        "per_rank": {"4": {"optimizer_bytes_per_s": {"adamw": {"1": 4e9, "32": 1e9}}}},
    }
    # a 2-rank group among 4 ranks: its own fit; alone: the 2-rank fit; 8 ranks: the 4-rank fit, a ring scaled
    assert collective_seconds(profile, "all_reduce", 2, 1, 0, world=4) == pytest.approx(2e-3)
    assert collective_seconds(profile, "all_reduce", 2, 1, 0, world=2) == pytest.approx(1e-3)
    assert collective_seconds(profile, "all_reduce", 8, 1, 0, world=8) == pytest.approx(4e-3 * 7 / 3)
    # the optimizer: log-linear between the measured tensor sizes, the nearest outside them
    assert optimizer_rate(profile, 4, "adamw", 1 << 20) == pytest.approx(4e9)
    assert optimizer_rate(profile, 4, "adamw", 1 << 30) == pytest.approx(1e9)
    middle = optimizer_rate(profile, 4, "adamw", (1 << 20) * 32**0.5)  # halfway on the log scale
    assert middle == pytest.approx(2.5e9)


def test_the_optimizer_step_is_timed_tensor_by_tensor():
    """Two 32 MiB embeddings and thirty-two 1 MiB projections: the embeddings run at the large
    tensors' rate, the projections at the small ones'; their mean size (2.9 MiB) would price every
    byte in between. Under FSDP each tensor is a ``1 / dp`` shard."""
    mib = 1 << 20
    profile = {"per_rank": {"4": {"optimizer_bytes_per_s": {"adamw": {"1": 4e9, "32": 1e9}}}}}
    sizes = (32 * mib, 32 * mib) + (mib,) * 32
    stage = StageFacts(matmul_weights=0, activation_elements=0, attention_layers=0, dense_bytes=sum(sizes),
                       expert_bytes=mib, dense_tensors=len(sizes), blocks=1, dense_sizes=sizes, expert_sizes=(mib,))  # fmt: skip
    priced = optimizer_seconds(profile, 4, "adamw", stage)
    assert priced == pytest.approx(64 * mib / 1e9 + 33 * mib / 4e9), (
        f"optimizer step priced {priced:.3e} s, not tensor by tensor"
    )
    mean = (sum(sizes) + mib) / optimizer_rate(profile, 4, "adamw", sum(sizes) / len(sizes))
    assert optimizer_seconds(profile, 4, "adamw", stage) > 1.3 * mean
    # facts built by hand without the sizes (a count and bytes only): every byte at the mean size
    bare = attrs.evolve(stage, dense_sizes=(), expert_sizes=())
    assert optimizer_seconds(profile, 4, "adamw", bare) == pytest.approx(mean)
    sharded = 2 * 16 * mib / optimizer_rate(profile, 4, "adamw", 16 * mib) + 32 * mib / 2 / 4e9 + mib / 4e9
    assert optimizer_seconds(profile, 4, "adamw", stage, shard=2) == pytest.approx(sharded)
    assert optimizer_seconds(profile, 4, "none", stage) == 0.0
    # a real model's facts: every parameter tensor once a stage (a tied one on each stage using it), split by stage
    from torch import nn

    model = nn.Sequential(nn.Embedding(64, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 64))
    model[3].weight = model[0].weight  # tied
    first, last = stage_facts(model, ["1", "2"], pp=2, ep=1)
    for s in (first, last):
        assert sum(s.dense_sizes) == s.dense_bytes and len(s.dense_sizes) == s.dense_tensors, s
    # the embedding before the first block; the head after the last, its weight tied to the embedding: the pipeline
    # holds a copy of it on the last stage too (their gradients summed), as explain's stage bytes count it
    assert sorted(first.dense_sizes) == [32, 256, 2048] and sorted(last.dense_sizes) == [32, 256, 256, 2048]


def test_the_compute_rate_follows_the_rank_s_microbatch_shape():
    """``block_flops`` scaled by ``block_shapes``: log-linear in the tokens per microbatch, at the
    largest measured TP degree not above the layout's; a layout whose microbatches run at half the
    rate predicts twice the compute."""
    shapes = {"1": {"128": 0.8, "2048": 1.0}, "4": {"128": 0.5, "2048": 0.9}}
    entry = {"block_shapes": {"float32": shapes}}
    assert shape_factor(entry, "float32", 128, 1) == pytest.approx(0.8)
    assert shape_factor(entry, "float32", 512, 1) == pytest.approx(0.9), "not log-linear between the measured points"
    assert shape_factor(entry, "float32", 64, 2) == pytest.approx(0.8)  # TP=2: TP=1's, the nearest outside
    assert shape_factor(entry, "bfloat16", 4096, 8) == pytest.approx(0.9)  # an unmeasured dtype: the first's

    def profile(factor: float) -> dict:
        flat = {tp: {n: factor for n in ("128", "2048")} for tp in ("1", "4")}
        rank = {"block_flops": {"float32": 1e10}, "block_shapes": {"float32": flat}, "copy_bytes_per_s": 1e10}
        return {"per_rank": {"1": rank}, "collectives": {}}

    stage = StageFacts(matmul_weights=1 << 20, activation_elements=0, attention_layers=0, dense_bytes=0,
                       expert_bytes=0, dense_tensors=1, blocks=1)  # fmt: skip
    facts = {"seq": 128, "batch": 1, "dtype": "float32", "itemsize": 4, "attention": (1, 1, False), "stages": [stage]}
    layout = {"dp": 1, "pp": 1, "sp": 1, "tp": 1, "ep": 1, "microbatches": 1, "data_parallel": None}
    full, half = (predict(facts, layout, profile(f), optimizer="none")["compute_s"] for f in (1.0, 0.5))
    assert half == pytest.approx(2 * full), (
        f"at half the reference block's rate the step took {half / full:.3f}x, not 2x"
    )
    assert full == pytest.approx(3 * 128 * 2 * (1 << 20) / 1e10)


def test_an_expert_s_matmuls_run_at_the_rate_of_the_rows_it_gets():
    """A rank's expert multiplies ``share`` of its microbatch's rows (``top_k x ep / experts``): its
    FLOPs at the block shape's rate for that row count, the dense ones at the microbatch's. Here 128
    tokens, an eighth of them to each expert: 16 rows, below the 32 measured (the nearest), at half
    the rate; the same experts with every row (``share`` 1) at the full rate."""
    rank = {"block_flops": {"float32": 1e10}, "block_shapes": {"float32": {"1": {"32": 0.5, "128": 1.0}}},
            "copy_bytes_per_s": 1e10}  # fmt: skip
    profile = {"per_rank": {"1": rank}, "collectives": {}}
    dense, experts = 1 << 20, 3 << 20
    facts = {"seq": 128, "batch": 1, "dtype": "float32", "itemsize": 4, "attention": (1, 1, False)}
    layout = {"dp": 1, "pp": 1, "sp": 1, "tp": 1, "ep": 1, "microbatches": 1, "data_parallel": None}

    def compute(share: float) -> float:
        stage = StageFacts(matmul_weights=dense + experts, activation_elements=0, attention_layers=0, dense_bytes=0,
                           expert_bytes=0, dense_tensors=1, blocks=1, expert_weights=experts, expert_share=share)  # fmt: skip
        return predict(facts | {"stages": [stage]}, layout, profile, optimizer="none")["compute_s"]

    unit = 3 * 128 * 2 / 1e10  # seconds per weight at the full rate
    assert compute(1.0) == pytest.approx(unit * (dense + experts))
    assert compute(1 / 8) == pytest.approx(unit * (dense + 2 * experts)), (
        f"an expert's 16 rows took {compute(1 / 8) / unit - dense:.0f} weights' time, not 2 x {experts}"
    )


def test_sequence_and_expert_traffic_runs_once_per_microbatch():
    """Under a pipeline each microbatch's layers exchange their share of the sequence split's and the experts'
    bytes: ``M`` times the calls of one step-sized batch, the same bytes; the gradients' all-reduce once a step.
    Here every call a millisecond whatever its bytes."""
    line = {"latency_s": 1e-3, "bytes_per_s": 1e30}
    profile = {
        "per_rank": {"2": {"send_recv": line, "copy_bytes_per_s": 1e30}},
        "collectives": {k: {"2": line} for k in KINDS},
    }
    stage = StageFacts(matmul_weights=0, activation_elements=0, attention_layers=0, dense_bytes=4, expert_bytes=0,
                       dense_tensors=1, blocks=3)  # fmt: skip
    facts = {"seq": 128, "batch": 8, "hidden": 1, "itemsize": 4, "stages": [stage, stage],
             "sp": {"per_layer": [("all_to_all", 4, 1000)]}, "ep": (2, 1000)}  # fmt: skip

    def calls(m: int, **dims) -> dict:
        layout = {"dp": 1, "pp": 2, "sp": 1, "tp": 1, "ep": 1, "microbatches": m, "data_parallel": "ddp"} | dims
        comm = communication(facts, layout, profile, stage)
        return {k: round(comm[k] / 1e-3) for k in ("sp", "ep")}

    # per microbatch: 4 all-to-alls in each of 3 layers and the sequence gathered twice; once: the gradients
    assert calls(1, sp=2) == {"sp": 12 + 2 + 1, "ep": 0}
    assert calls(4, sp=2) == {"sp": 4 * (12 + 2) + 1, "ep": 0}, "the sequence's traffic counted once a step"
    assert calls(2, dp=2, ep=2) == {"sp": 0, "ep": 2 * 2 * 3}, "the experts' dispatch counted once a step"


def test_a_data_parallel_engine_s_flat_gradients_are_written_into_fresh_buffers():
    """FSDP reduce-scatters each unit's gradients from a flat buffer made anew each step (each block's, the root's);
    DDP under a pipeline is FSDP's replicate of the whole stage: one all-reduce, its gradients written flat anew and
    copied back; DDP's own buckets are kept from step to step. Each priced at the profile's rate for a fresh buffer
    of that size: here 1 GB/s at 1 MiB, 0.1 GB/s from 64 MiB (a CPU's newly mapped pages), collectives free."""
    line = {"latency_s": 0.0, "bytes_per_s": 1e30}
    rank = {"send_recv": line, "copy_bytes_per_s": 1e30, "fresh_bytes_per_s": {"1": 1e9, "64": 1e8}}
    profile = {"per_rank": {"2": rank}, "collectives": {k: {"2": line} for k in KINDS}}
    mib = 1 << 20
    stage = StageFacts(matmul_weights=0, activation_elements=0, attention_layers=0, dense_bytes=129 * mib,
                       expert_bytes=0, dense_tensors=3, blocks=2, end_bytes=mib)  # fmt: skip
    facts = {"seq": 128, "batch": 4, "hidden": 1, "itemsize": 4, "stages": [stage, stage]}

    def dp_seconds(kind: str, pp: int) -> float:
        layout = {"dp": 2, "pp": pp, "sp": 1, "tp": 1, "ep": 1, "microbatches": 2, "data_parallel": kind}
        return communication(facts, layout, profile, stage)["dp"]

    assert dp_seconds("fsdp", 1) == pytest.approx(2 * 64 * mib / 1e8 + mib / 1e9), "FSDP's units' flat gradients"
    assert dp_seconds("fsdp", 2) == pytest.approx(2 * 64 * mib / 1e8 + mib / 1e9)
    assert dp_seconds("ddp", 2) == pytest.approx(2 * 129 * mib / 1e8), "a pipeline stage's replicate: not priced"
    assert dp_seconds("ddp", 1) == pytest.approx(0.0, abs=1e-12), "DDP's kept buckets priced as fresh buffers"


def test_the_loss_is_priced_at_the_measured_rate_over_the_vocabulary_each_rank_computes():
    """The loss's forward and backward over a token's logits at the profile's cross-entropy rate: under TP with
    the logits gathered (``parallel_output=False``), every rank computes it over the whole vocabulary, not its
    slice; a bfloat16 model's logits are upcast and their gradient cast back (an elementwise pass each); a profile
    calibrated before the rate was measured prices it as passes at the copy bandwidth. The rate is read at each
    call's logits (a microbatch's), between the sizes measured: large logits leave a CPU's caches."""

    def profile(loss_rate: float | dict | None) -> dict:
        flat = {tp: {"128": 1.0} for tp in ("1", "4")}
        rank = {"block_flops": {"float32": 1e30, "bfloat16": 1e30}, "block_shapes": {"float32": flat},
                "copy_bytes_per_s": 1e10} | ({"loss_elements_per_s": loss_rate} if loss_rate else {})  # fmt: skip
        return {"per_rank": {"1": rank, "4": rank}, "collectives": {}}

    vocab = 1000  # the head's rows on this rank: the vocabulary's slice at TP=4
    stage = StageFacts(matmul_weights=0, activation_elements=0, attention_layers=0, dense_bytes=0, expert_bytes=0,
                       dense_tensors=1, blocks=1, logits=vocab)  # fmt: skip

    def loss_s(tp: int, gathered: int, rate, itemsize: int = 4, **split) -> float:
        facts = {"seq": 128, "batch": 2, "dtype": "float32" if itemsize == 4 else "bfloat16", "itemsize": itemsize,
                 "attention": (1, 1, False), "stages": [stage], "logits_gathered": gathered}  # fmt: skip
        layout = {"dp": 1, "pp": 1, "sp": 1, "tp": tp, "ep": 1, "microbatches": 1, "data_parallel": None} | split
        return predict(facts, layout, profile(rate), optimizer="none")["compute_s"]

    tokens = 2 * 128
    assert loss_s(1, 1, 1e8) == pytest.approx(tokens * vocab / 1e8), "the loss not at the measured rate"
    assert loss_s(4, 4, 1e8) == pytest.approx(tokens * 4 * vocab / 1e8), "the gathered logits: the whole vocabulary"
    assert loss_s(4, 1, 1e8) == pytest.approx(tokens * vocab / 1e8), "parallel_output: the rank's slice only"
    casts = 2 * tokens * vocab * (4 + 2) / 1e10
    assert loss_s(1, 1, 1e8, itemsize=2) == pytest.approx(tokens * vocab / 1e8 + casts), "bfloat16: casts missing"
    assert loss_s(4, 4, None) == pytest.approx(LOSS_PASSES * tokens * 4 * vocab * 4 / 1e10)
    # by the logits' size (each call's: a pipeline's microbatch, one at a time): log-linear between the sizes
    curve = {str(tokens * vocab): 4e8, str(4 * tokens * vocab): 1e8}
    assert loss_s(1, 1, curve) == pytest.approx(tokens * vocab / 4e8), "a small call priced at the large ones' rate"
    assert loss_s(4, 4, curve) == pytest.approx(tokens * 4 * vocab / 1e8), "large logits at the small ones' rate"
    middle = tokens * 2 * vocab / (4e8 * 0.5 + 1e8 * 0.5)  # half way between the sizes in log
    assert loss_s(4, 2, curve) == pytest.approx(middle), "not log-linear between the measured sizes"
    split = {"microbatches": 4}
    assert loss_s(4, 4, curve, **split) == pytest.approx(tokens * 4 * vocab / 4e8), "a microbatch's call priced whole"


def test_a_pipeline_waits_on_the_other_stages_single_slots():
    """1F1B over M microbatches, run microbatch by microbatch. Each rank on its own device: four equal stages take
    M + P - 1 slots (the classic bubble); a last stage three times the others (a head and its loss) waits on their
    single slots only, not on P - 1 slots of its own. Where ranks share the devices, the ranks with work share them:
    never less than the work over the devices, nor than the microbatches' path at the unshared speed."""

    def profile(shared: float) -> dict:
        rank = {"block_flops": {"float32": 1e10}, "block_shapes": {"float32": {"1": {"128": 1.0}}},
                "copy_bytes_per_s": 1e10, "send_recv": {"latency_s": 0.0, "bytes_per_s": 1e30}}  # fmt: skip
        return {"per_rank": {"1": {**rank, "block_flops": {"float32": 1e10 / shared}}, "4": rank}, "collectives": {}}

    def stage(weights: int) -> StageFacts:
        return StageFacts(matmul_weights=weights, activation_elements=0, attention_layers=0, dense_bytes=0,
                          expert_bytes=0, dense_tensors=1, blocks=1)  # fmt: skip

    def step(weights: list[int], shared: float = 1.0) -> dict:
        facts = {"seq": 128, "batch": 4, "dtype": "float32", "itemsize": 4, "hidden": 1, "attention": (1, 1, False),
                 "stages": [stage(w) for w in weights]}  # fmt: skip
        layout = {"dp": 1, "pp": len(weights), "sp": 1, "tp": 1, "ep": 1, "microbatches": 4, "data_parallel": None}
        return predict(facts, layout, profile(shared), optimizer="none")

    unit = 3 * 4 * 128 * 2 * (1 << 20) / 1e10  # one stage's step of 2**20 weights: 3 x the forward's FLOPs
    even = step([1 << 20] * 4)
    assert even["step_s"] == pytest.approx(unit * 7 / 4), f"equal stages on their own devices: {even['step_s'] / unit}"
    assert even["bubble_s"] == pytest.approx(unit * 3 / 4)
    heavy = step([1 << 20] * 3 + [3 << 20])
    assert heavy["step_s"] == pytest.approx(unit * (6 + 3 * 3) / 4), (
        f"a heavy last stage's step: {heavy['step_s'] / unit:.3f} units, not (6 + 3 x 3) / 4"
    )
    assert heavy["bubble_s"] == pytest.approx(unit * 3 / 4) and heavy["compute_s"] == pytest.approx(3 * unit)
    # 4 ranks on 2 devices, each at half its unshared speed with all at work (a unit is at the shared speed). The
    # equal stages, traced by hand in 24ths of a unit (a forward 1, a backward 2 at the unshared speed; 2 ranks with
    # work run at full speed, 3 at 2/3, 4 at 1/2): 27, where the devices busy throughout would take 24 (the first
    # microbatch fills the pipeline and the last drains it while devices idle) and the path alone 21
    shared = step([1 << 20] * 4, shared=0.5)["step_s"]
    assert shared == pytest.approx(unit * 27 / 24), f"equal stages on shared devices: {shared / unit * 24:.2f} / 24"
    heavy = step([1 << 20] * 3 + [3 << 20], shared=0.5)["step_s"]  # its path alone 15/8 units, its work 6/4
    assert heavy >= unit * 15 / 8 * (1 - 1e-9) and heavy >= unit * 6 / 4, f"heavy stage, shared: {heavy / unit:.3f}"
    # a second stage that waits for the first's forwards: three stages of 2, 1 and 1 over two microbatches on 1.5
    # devices (shared 0.5), traced by hand in 12ths (the first stage's forward 2, backward 4; the others' 1 and 2;
    # 1, 2, 3 ranks with work at 1, 3/4, 1/2): the second stage's second forward waits from 10/3 to 14/3 for the
    # first's, and the step ends at 56/3 twelfths, 14/9 of the stages' unit
    waited = one_f_one_b([2.0, 1.0, 1.0], [0.0, 0.0, 0.0], 2, 0.5)
    assert waited == pytest.approx(14 / 9), f"a forward before the previous stage's: {waited * 9:.3f} / 9"


def test_a_named_profile_of_another_version_is_refused_not_measured_over(tmp_path, monkeypatch):
    """A profile file the user names (``explain --auto --profile FILE``, a benchmark's committed one) that is of
    another version is refused naming the command that measures it again, and left as it was: measuring over
    it would replace a committed or shared profile with this machine's. The default cache is measured again;
    ``shardcore calibrate --out FILE`` (``replace``) measures into the named file."""
    from shardcore.cost import profile as profile_module

    measured = []
    monkeypatch.setattr(profile_module, "calibrate", lambda sizes, out=None: measured.append(out) or {"version": 6})
    named = tmp_path / "committed.json"
    text = json.dumps({"version": -1, "matmul_flops": {"float32": 1.0}})
    named.write_text(text)
    try:
        load_profile(named)
        said = "nothing"
    except ValueError as refused:
        said = str(refused)
    assert measured == [], f"the named profile was measured over: {measured}"
    assert named.read_text() == text, "the named profile changed"
    assert "is of another shardcore version" in said and f"shardcore calibrate --out {named}" in said, said
    load_profile(named, replace=True)  # calibrate's own
    assert measured == [named], f"calibrate --out measured {measured}"
    monkeypatch.setattr(profile_module, "profile_path", lambda *a, **k: named)
    measured.clear()
    load_profile()  # the default cache: measured again
    assert measured == [named], f"the stale default cache was not measured again: {measured}"


def test_a_profile_of_another_version_is_not_read(tmp_path):
    """A cached profile an earlier shardcore measured (another format) is measured again, or,
    inside a job, refused naming the command; never read as if it were current."""
    stale = tmp_path / "old.json"
    stale.write_text(json.dumps({"version": -1, "matmul_flops": {}}))
    try:
        load_profile(stale, measure=False)
        refused = "nothing (the stale profile was read)"
    except FileNotFoundError as exc:
        refused = str(exc)
    assert "is of another shardcore version" in refused, f"a profile of version -1 gave {refused!r}"
