"""``shardcore explain --auto``: every layout of a world checked by optimize's own checks on a meta
model, predicted by the cost model over a profile, the memory cap obeyed, a 70B-shaped answer fast;
``ShardConfig(auto=...)``: the same choice made inside a job of 4 gloo ranks, the same on every rank."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time

import pytest
import torch
from llama_cases import build

import shardcore
from shardcore import AutoLayout, ShardConfig
from shardcore.cli import main
from shardcore.cost import candidates, search, shard_config
from shardcore.cost.profile import VERSION
from shardcore.distributed import ParallelLayout
from shardcore.testing import dp_part, run_on_ranks


def _fit(latency: float, bandwidth: float) -> dict:
    return {"latency_s": latency, "bytes_per_s": bandwidth}


def synthetic_profile(shared: bool = False) -> dict:
    """A profile with round numbers (no measurement): 4 ranks as fast as 2 unless ``shared``."""

    def per_rank(slow: float) -> dict:
        return {
            "matmul_flops": {"float32": 1e11 / slow, "bfloat16": 4e11 / slow},
            "block_flops": {"float32": 8e10 / slow, "bfloat16": 3e11 / slow},
            "block_shapes": {"float32": {"1": {"128": 1.0, "2048": 1.0}}},  # every shape at the block's rate
            "copy_bytes_per_s": 2e10 / slow,
            "optimizer_bytes_per_s": {
                "adamw": {"1": 2e9 / slow, "32": 1e9 / slow},
                "sgd": {"1": 2e10 / slow, "32": 1e10 / slow},
            },
            "send_recv": _fit(5e-5, 3e9),
        }

    kinds = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    return {
        "version": VERSION,
        "path": "synthetic",
        "per_rank": {"2": per_rank(1.0), "4": per_rank(2.0 if shared else 1.0)},
        "collectives": {k: {"2": _fit(1e-4, 2e9), "4": _fit(3e-4, 1.5e9)} for k in kinds},
        "memory_bytes_per_rank": 8 << 30,
    }


def meta_llama(**cfg):
    with shardcore.init_empty():
        return build("LlamaForCausalLM", **cfg)


def test_every_layout_of_the_world_is_predicted_or_refused_with_optimize_s_message():
    import transformers

    model = meta_llama(heads=4, kv=2, layers=2)
    result = search(model, 4, synthetic_profile(), seq=64, batch=4)
    all_layouts = candidates(4, batch=4, seq=64, blocks=2)
    seen = [r["layout"] for r in result["ranked"]] + [r["layout"] for r in result["refused"]]
    assert sorted(map(str, seen)) == sorted(map(str, all_layouts)) and result["candidates"] == len(all_layouts)
    names = {r["name"] for r in result["ranked"]}
    reasons = {r["name"]: r["refused"] for r in result["refused"]}
    ring = "sp2 x tp2 (ring_attn)"  # transformers 4.x lacks the registries the ring runs attention through
    v4 = int(transformers.__version__.split(".")[0]) < 5
    if v4:
        assert "attention and mask registries" in reasons[ring], reasons.get(ring)
    assert {"tp4", "dp4 (ddp)", "dp4 (fsdp)", "dp2 x tp2 (ddp)", "pp2 x tp2 (M=4)", *([] if v4 else [ring])} <= names
    assert not any(p.is_meta is False for p in model.parameters()) and type(model.lm_head) is torch.nn.Linear
    traced = result["elementwise"]  # the model's elementwise work, traced once on the meta device, left without grads
    assert traced["ops"] > 0 and min(traced["whole"], traced["split"], traced["fixed"]) > 0, traced
    assert all(p.grad is None for p in model.parameters())
    from shardcore.cost.report import format_search

    assert "the profile has no elementwise rate (`shardcore calibrate --force`" in format_search(result)
    rates = synthetic_profile()
    for entry in rates["per_rank"].values():
        entry["elementwise_bytes_per_s"] = {"1000": 1e10}
    priced = search(model, 4, rates, seq=64, batch=4)
    assert priced["elementwise_priced"] and "compute priced by FLOPs alone" not in format_search(priced)
    for row in result["ranked"]:  # each one a config optimize takes for 4 ranks
        config = shard_config(row["layout"])
        assert ParallelLayout.from_config(config, world_size=4).degrees == {
            k: row["layout"][k] for k in "dp pp sp tp".split()
        }
        assert row["step_s"] > 0 and row["memory_bytes"]["total"] > 0
    # 2 KV heads: Ulysses over tp x sp = 4 is refused by the check optimize runs, with its words
    ulysses = "attention and mask registries" if v4 else "key/value heads do not split"
    assert ulysses in reasons["sp4 (all_to_all)"], reasons["sp4 (all_to_all)"]
    assert {"dp2 x pp2 (ddp, M=2)", "dp2 x pp2 (fsdp, M=2)"} <= names  # 3-D layouts are predicted too
    assert result["best"]["why"] == "fastest predicted"
    steps = [r["step_s"] for r in result["ranked"]]
    assert steps == sorted(steps) and all("x the best" in r["why"] for r in result["ranked"][1:])


def test_the_chosen_layout_never_exceeds_the_memory_cap():
    model = meta_llama(heads=4, kv=4, layers=2, vocab=256)
    free = search(model, 4, synthetic_profile(), seq=64, batch=4)
    fastest = free["best"]
    cap = fastest["memory_bytes"]["total"] - 1  # rules out the fastest
    capped = search(model, 4, synthetic_profile(), seq=64, batch=4, memory=cap)
    best = capped["best"]
    assert best is not None and best["name"] != fastest["name"], f"the cap did not rule out {fastest['name']}"
    assert best["memory_bytes"]["total"] <= cap, f"{best['name']} chosen over the memory cap"
    over = next(r for r in capped["ranked"] if r["name"] == fastest["name"])
    assert not over["fits"] and "over the cap" in over["why"], f"{over['name']} over the cap ranked as fitting"
    fitting = [r for r in capped["ranked"] if r["fits"]]
    assert best is fitting[0] and all(r["step_s"] >= best["step_s"] for r in fitting)
    none = search(model, 4, synthetic_profile(), seq=64, batch=4, memory=1024)
    assert none["best"] is None and not any(r["fits"] for r in none["ranked"]), "a layout fits in 1 KiB"


def test_sharding_memory_falls_as_the_layout_splits_more():
    model = meta_llama(heads=4, kv=4, layers=4, vocab=256)
    rows = {r["name"]: r for r in search(model, 4, synthetic_profile(), seq=64, batch=4)["ranked"]}
    mem = {n: r["memory_bytes"] for n, r in rows.items()}
    assert mem["dp4 (fsdp)"]["parameters"] < mem["dp4 (ddp)"]["parameters"] / 3
    assert mem["tp4"]["parameters"] < mem["dp2 x tp2 (ddp)"]["parameters"] < mem["dp4 (ddp)"]["parameters"]
    assert mem["dp4 (ddp)"]["optimizer"] == 2 * mem["dp4 (ddp)"]["parameters"]  # AdamW: two moments
    # under 1F1B the first stage holds min(P, M) microbatches: more activations than one microbatch
    assert mem["pp4 (M=4)"]["activations"] > 0


def test_a_pipeline_bubble_costs_on_dedicated_devices_and_is_reclaimed_where_ranks_share_them():
    model = meta_llama(heads=4, kv=4, layers=4)
    kw = {"seq": 64, "batch": 4, "optimizer": "none"}
    dedicated = {r["name"]: r for r in search(model, 4, synthetic_profile(), **kw)["ranked"]}
    shared = {r["name"]: r for r in search(model, 4, synthetic_profile(shared=True), **kw)["ranked"]}
    pp = dedicated["pp4 (M=4)"]
    stages = pp["stages_s"]  # one block each, the last with the head: the heaviest
    assert len(stages) == 4 and stages[-1] == max(stages) == pytest.approx(pp["compute_s"])  # no collectives in a block
    # the first microbatch's slot on every other stage (1F1B: (P - 1) slots where the stages are equal)
    bubble = (sum(stages) - max(stages)) / 4
    assert pp["bubble_s"] == pytest.approx(bubble, rel=1e-9), f"pipeline bubble {pp['bubble_s']} s, not {bubble} s"
    assert pp["step_s"] == pytest.approx(max(stages) + pp["bubble_s"] + pp["communication_s"]["pp"], rel=1e-9)
    assert shared["pp4 (M=4)"]["bubble_s"] < pp["bubble_s"] * 2 * 0.75  # the others run faster meanwhile


def test_explain_auto_prints_the_choice_and_its_config(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(synthetic_profile()))
    directory = tmp_path / "tiny"
    config = meta_llama(heads=4, kv=2, layers=2).config
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(directory)
    argv = [
        "explain",
        str(directory),
        "--auto",
        "--world",
        "4",
        "--seq",
        "64",
        "--batch",
        "4",
        "--profile",
        str(profile),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "chosen: " in out and "shardcore.ShardConfig(tensor_parallel_size=" in out and "why not first" in out
    assert "refused: " in out
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["best"]["config"]["tensor_parallel_size"] == result["best"]["layout"]["tp"]
    lines = out.splitlines()
    first_row = lines[lines.index(next(line for line in lines if line.startswith("layout "))) + 1]
    assert first_row.split()[0] == result["best"]["name"].split()[0], (
        f"the table's first row is {first_row.split()[0]!r}, not the chosen layout {result['best']['name']!r}"
    )
    assert main([*argv, "--memory", "0.000001"]) == 1
    assert "no layout fits the memory cap" in capsys.readouterr().out
    assert main(["explain", str(directory), "--auto", "--world", "4"]) == 2
    assert "--world N --seq L" in capsys.readouterr().err
    assert main([*argv, "--batch", "3", "--json"]) == 0  # 3 sequences do not split over 2 or 4 ranks
    assert {r["layout"]["dp"] for r in json.loads(capsys.readouterr().out)["ranked"]} == {1}


@pytest.mark.slow  # an 80-layer model on paper, 64 ranks: nox -s tests-slow
def test_explain_auto_for_a_70b_llama_on_64_ranks_answers_in_seconds_without_the_model(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(synthetic_profile()))
    import transformers

    config = transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                      num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                                      torch_dtype="bfloat16")  # fmt: skip
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(tmp_path / "llama70b")
    script = (
        "import json, resource, sys, time; from shardcore.cli import main; t = time.perf_counter();"
        f"code = main(['explain', {str(tmp_path / 'llama70b')!r}, '--auto', '--world', '64', '--seq', '4096', "
        f"'--batch', '64', '--memory', '80', '--profile', {str(profile)!r}, '--json']);"
        "print(json.dumps({'code': code, 'seconds': time.perf_counter() - t,"
        " 'rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), file=sys.stderr)"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    result = json.loads(done.stdout)
    assert stats["code"] == 0 and result["best"] is not None
    assert result["best"]["memory_bytes"]["total"] <= 80 * 2**30
    print(f"explain --auto for 70B on 64 ranks: {wall:.1f} s (reported; speed lives in benchmarks)")
    assert stats["rss_mb"] < 1536, f"explain --auto held {stats['rss_mb']:.0f} MB"
    assert result["candidates"] > 100 and len(result["ranked"]) > 10
    # every refusal is a reason in the model or the layout, none a combination shardcore lacks
    unbuilt = [r["name"] + ": " + r["refused"] for r in result["refused"] if "not built yet" in r["refused"]]
    assert not unbuilt, unbuilt
    print(f"{len(result['ranked'])} of {result['candidates']} layouts ranked, {len(result['refused'])} refused")


AUTO_CFG = {"heads": 4, "kv": 4, "layers": 2, "vocab": 256}


def _auto_job(auto: AutoLayout) -> dict:
    """On each rank: optimize with ``auto``, then the first loss on this rank's data-parallel part
    against the unsharded model's on the same part."""
    torch.manual_seed(0)
    model = build("LlamaForCausalLM", **AUTO_CFG)
    reference = copy.deepcopy(model)
    ids = torch.randint(1, 256, (auto.batch, auto.seq), generator=torch.Generator().manual_seed(1))
    try:
        model = shardcore.optimize(model, ShardConfig(auto=auto))
    except Exception as err:  # every rank must raise the same
        return {"error": f"{type(err).__name__}: {err}"}
    info = model.shardcore
    part = dp_part({"input_ids": ids, "labels": ids}, info.layout.coordinates(torch.distributed.get_rank())["dp"],
                   info.layout.dp)  # fmt: skip
    loss = shardcore.pipeline_step(model, part) if info.layout.pp > 1 else model(**part).loss
    with torch.no_grad():
        expected = reference(**part).loss
    return {
        "auto": info.auto,
        "degrees": info.layout.degrees,
        "data_parallel": info.data_parallel,
        "config_auto": info.config.auto,
        "loss_rel_diff": abs(loss.item() - expected.item()) / abs(expected.item()),
    }


def _profile_file(tmp_path) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(synthetic_profile(shared=True)))
    return str(path)


def test_auto_config_shards_every_rank_by_the_layout_explain_auto_chooses(tmp_path):
    profile = _profile_file(tmp_path)
    plan = search(meta_llama(**AUTO_CFG), 4, synthetic_profile(shared=True), seq=64, batch=4)
    fastest = plan["best"]
    cap_gb = (fastest["memory_bytes"]["total"] - 1) / 2**30  # rules out the fastest
    capped = search(meta_llama(**AUTO_CFG), 4, synthetic_profile(shared=True), seq=64, batch=4, memory=cap_gb * 2**30)
    for auto, best in [
        (AutoLayout(seq=64, batch=4, profile=profile), fastest),
        (AutoLayout(seq=64, batch=4, profile=profile, memory_gb=cap_gb), capped["best"]),
    ]:
        reports = run_on_ranks(4, _auto_job, auto)
        assert all(r == {**reports[0], "loss_rel_diff": r["loss_rel_diff"]} for r in reports), reports
        chosen = reports[0]
        assert chosen["auto"]["name"] == best["name"] and chosen["auto"]["config"] == best["config"]
        assert chosen["degrees"] == {k: best["layout"][k] for k in ("dp", "pp", "sp", "tp")}
        assert chosen["data_parallel"] == best["layout"]["data_parallel"] and chosen["config_auto"] is None
        assert chosen["auto"]["memory_bytes"]["total"] <= (auto.memory_gb or 8) * 2**30
        assert max(r["loss_rel_diff"] for r in reports) <= 1e-5
    assert capped["best"]["name"] != fastest["name"]


def test_auto_refuses_alike_on_every_rank_with_what_to_do(tmp_path):
    missing = run_on_ranks(4, _auto_job, AutoLayout(seq=64, batch=4, profile=str(tmp_path / "none.json")))
    errors = [r["error"] for r in missing]
    assert len(set(errors)) == 1 and "shardcore calibrate" in errors[0], f"the ranks refused unalike: {errors}"
    assert missing[0]["error"].startswith("FileNotFoundError")
    tiny = run_on_ranks(4, _auto_job, AutoLayout(seq=64, batch=4, profile=_profile_file(tmp_path), memory_gb=1e-6))
    assert len({r["error"] for r in tiny}) == 1 and "no layout of 4 ranks fits" in tiny[0]["error"]
    with pytest.raises(ValueError, match="tensor_parallel_size=2 was given too"):
        ShardConfig(auto=True, tensor_parallel_size=2)
    with pytest.raises(TypeError, match="AutoLayout"):
        ShardConfig(auto="yes")
    from shardcore.steps import shard as core_optimize

    with pytest.raises(ValueError, match=r"chosen by shardcore\.optimize before sharding"):
        core_optimize(build("LlamaForCausalLM", **AUTO_CFG), ShardConfig(auto=True))
    with pytest.raises(ValueError, match="set the layout yourself"):
        shardcore.optimize(build("LlamaForCausalLM", **AUTO_CFG), ShardConfig(auto=True), policy=object())


@pytest.mark.parametrize("tie", [False, True])
def test_the_cost_facts_split_a_llama_s_bytes_and_matmul_weights_by_stage_as_counted_by_name(tie):
    """What the cost model reads per stage, against the parameters counted by name: the first
    stage holds the embedding and block 0, the last block 1, the final norm and the head (tied to
    the embedding: its copy there, as the pipeline holds it); a token multiplies by every 2-D weight
    but the embedding's; 4 heads of 16 at TP=2 are 2 per rank."""
    from shardcore.cost.facts import attention_width, stage_facts

    model = meta_llama(heads=4, kv=2, layers=2, tie=tie)
    named = dict(model.named_parameters(remove_duplicate=False))

    def held(*prefixes):
        return sum(p.numel() * p.element_size() for n, p in named.items() if n.startswith(prefixes))

    def multiplied(*prefixes):
        return sum(p.numel() for n, p in named.items() if n.startswith(prefixes) and p.dim() == 2 and "embed" not in n)

    first, last = stage_facts(model, ["model.layers.0", "model.layers.1"], pp=2, ep=1)
    got = [(first.dense_bytes, first.matmul_weights), (last.dense_bytes, last.matmul_weights)]
    want = [
        (held("model.embed_tokens.", "model.layers.0."), multiplied("model.layers.0.")),
        (held("model.layers.1.", "model.norm.", "lm_head."), multiplied("model.layers.1.", "lm_head.")),
    ]
    assert got == want, f"per stage (bytes held, weights a token multiplies by): {got}, counted by name {want}"
    from shardcore.explain import explain

    stages = explain(model, 1, pp=2)["pipeline_stage_bytes"]
    assert stages == [w[0] for w in want], f"explain --pp 2 says the stages hold {stages} bytes, not {want}"
    heads, dim, causal = attention_width(model, shardcore.resolve_policy(model, None), 2)
    assert (heads, dim, causal) == (2, model.config.hidden_size // 4, True), f"attention facts {(heads, dim, causal)}"


def test_fsdp_holds_its_root_unit_and_two_blocks_gathered_at_the_peak():
    """What explain counts as gathered beside the shards, against the parameters counted by name: under
    FSDP and HSDP the root unit (embedding, final norm, head) and two blocks whole; ZeRO-2 every
    weight; DDP and one data-parallel rank nothing."""
    from shardcore.cost.facts import gathered_bytes, stage_facts

    model = meta_llama(heads=4, kv=2, layers=4)
    named = dict(model.named_parameters())

    def held(*prefixes):
        return sum(p.numel() * p.element_size() for n, p in named.items() if n.startswith(prefixes))

    (stage,) = stage_facts(model, [f"model.layers.{i}" for i in range(4)], pp=1, ep=1)
    ends, block = held("model.embed_tokens.", "model.norm.", "lm_head."), held("model.layers.0.")
    assert stage.end_bytes == ends and stage.dense_bytes == held("")
    assert gathered_bytes(stage, "fsdp", 2) == gathered_bytes(stage, "hsdp", 4) == ends + 2 * block
    assert gathered_bytes(stage, "zero2", 2) == held("")
    assert gathered_bytes(stage, "ddp", 2) == gathered_bytes(stage, "fsdp", 1) == 0


def test_fsdp_walks_its_backward_to_where_it_holds_the_most():
    """Without a pipeline FSDP and HSDP peak where their backward holds the most (``cost.memory``'s walk, as
    tracked 70B ranks hold it): a long sequence at the backward's start, with the root unit gathered and the last
    all-gather's buffer of a block beside every activation; a short one (the activations next to nothing) in the
    backward's last block, the first, with the root and the largest block gathered, the head's gradient whole,
    the other blocks' reduce-scattered, and FSDP's buffers of three blocks. (On tracked 70B ranks at 4096 tokens
    the activations still held put it in the second block from the end: ``test_core_tracked_memory``.)"""
    from shardcore.cost.memory import memory_per_rank
    from shardcore.cost.search import workload_facts
    from shardcore.cost.tracked import cost_layout

    model = meta_llama(heads=4, kv=2, layers=4)
    named = dict(model.named_parameters())

    def held(*prefixes):
        return sum(p.numel() * p.element_size() for n, p in named.items() if n.startswith(prefixes))

    ends, tail = held("model.embed_tokens.", "model.norm.", "lm_head."), held("model.norm.", "lm_head.")
    block = max(held(f"model.layers.{i}.") for i in range(4))

    def row(mode: str, seq: int, optimizer: str = "adamw") -> tuple[dict, object]:
        shard = {"data_parallel_shard_size": 2} if mode == "hsdp" else {}
        config = shardcore.ShardConfig(tensor_parallel_size=1, data_parallel_size=4, data_parallel=mode, **shard)
        layout = cost_layout(config)
        facts = workload_facts(model, layout, seq=seq, batch=4)
        return memory_per_rank(facts, layout, optimizer), facts["stages"][0]

    (long, stage), (ddp, _) = row("fsdp", 4096), row("ddp", 4096)  # FSDP over 4 ranks
    assert (stage.tail_bytes, stage.largest_block) == (tail, block), "the head's bytes, the largest block's"
    assert long["gathered"] == ends, f"at the backward's start the root unit alone is gathered: {long['gathered']} B"
    assert long["activations"] == ddp["activations"] + block, "every activation and the last all-gather's block"
    short, _ = row("hsdp", 8, "none")  # AdamW's step would peak above the backward on so small a model
    assert short["gathered"] == ends + block, f"in a block's backward the root and the block: {short['gathered']} B"
    assert short["activations"] >= 3 * block, "FSDP's three blocks of buffers in the backward's last block"
    held_grads = tail + 3 * block / 2  # the head's whole, three blocks' reduce-scattered over HSDP's 2 shards
    parts = short["parameters"] + short["gathered"] + short["optimizer"] + short["activations"] + held_grads
    assert short["total"] == pytest.approx(parts, abs=4), f"the peak {short['total']} B is not the walk's {parts} B"


def test_split_gather_keeps_the_regions_edges_and_the_norms_inputs_split():
    """Under Megatron's split explain counts a block's region entries (the input the column-parallel layers
    read, once however many read it: attention's and the MLP's; kept as the rank's part of the sequence,
    gathered again in the backward), the norms' float32 inputs and their normalized copies at 1/tp of tensor
    parallelism's; the rest (the head's, the region's inside, whatever its width: this model's MLP is 128
    wide, 64 a rank, as wide as its hidden states) as TP=2 alone counts it."""
    from shardcore.cost.facts import stage_facts
    from shardcore.cost.tracked import predicted_memory

    model = meta_llama(heads=4, kv=2, layers=2)
    hidden, blocks = model.config.hidden_size, ["model.layers.0", "model.layers.1"]
    assert model.config.intermediate_size == 2 * hidden, "the MLP's rank share is as wide as the hidden states"
    (stage,) = stage_facts(model, blocks, pp=1, ep=1)
    assert stage.wide_elements == stage.norm_elements, "unsharded: no region, the norms' copies only"
    seq, tp = 64, 2
    plain = predicted_memory(model, ShardConfig(tensor_parallel_size=tp), seq=seq, batch=1)
    split = ShardConfig(tensor_parallel_size=tp, enable_sequence_parallelism=True)
    split = predicted_memory(model, split, seq=seq, batch=1)
    itemsize = next(model.parameters()).element_size()
    entries = 2 * len(blocks) * hidden  # attention's input and the MLP's, one each a block
    kept = seq * ((entries + stage.norm_elements) * itemsize + 4 * stage.norm_elements) * (1 - 1 / tp)
    fewer = plain["activations"] - split["activations"]
    assert abs(fewer - kept) <= 1, f"split_gather keeps {fewer} B fewer activations than TP alone, not {kept:.0f} B"
    assert {k: v for k, v in plain.items() if k not in ("activations", "total")} == {
        k: v for k, v in split.items() if k not in ("activations", "total")
    }


def test_a_block_keeps_each_tensor_its_backward_reads_once():
    """What explain counts a token leaves for the backward, against a Llama block's tensors counted by hand, at
    TP=2 (read off the layers' classes) and TP=1 (nothing replaced: the policy's plan gives the roles): the
    input q, k and v read, once, and their outputs; o_proj's input, not its output (the residual sum keeps
    nothing); the input gate and up read, once, their outputs and the activation's (the product's backward
    reads it); down's input; each norm's normalized copy (its float32 input counted apart). Measured on
    tracked Llama-3-70B ranks at TP=8: each matmul's input and output counted, the activations were 11% over."""
    from shardcore.cost.search import workload_facts
    from shardcore.cost.tracked import cost_layout

    model = meta_llama(heads=4, kv=2, layers=2)
    cfg = model.config
    hidden, inter, vocab, dim = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.hidden_size // 4
    names = [n for n, _ in model.named_parameters()]  # the walk's order: module order, each tensor once here
    for tp in (2, 1):
        layout = cost_layout(ShardConfig(tensor_parallel_size=tp))
        (stage,) = workload_facts(model, layout, seq=64, batch=1)["stages"]
        want = {
            "self_attn.q_proj": hidden + 4 * dim // tp,  # the input q, k and v read, and q
            "self_attn.k_proj": 2 * dim // tp,
            "self_attn.v_proj": 2 * dim // tp,
            "self_attn.o_proj": 4 * dim // tp,  # its input only
            "mlp.gate_proj": hidden + inter // tp,  # the input gate and up read, and gate
            "mlp.up_proj": 2 * inter // tp,  # up and the activation's output
            "mlp.down_proj": inter // tp,  # its input only
            "input_layernorm": hidden,  # the normalized copy (the float32 input counted apart)
            "post_attention_layernorm": hidden,
        }
        got = dict(zip(names, (act for _, _, act, _ in stage.walk), strict=True))
        for part, elements in want.items():
            for layer in (0, 1):
                name = f"model.layers.{layer}.{part}.weight"
                assert got[name] == elements, f"TP={tp}: {name} leaves {got[name]} elements a token, not {elements}"
        total = 2 * sum(want.values()) + hidden + hidden + vocab // tp  # the final norm's copy, the head's sides
        assert stage.activation_elements == total, f"TP={tp}: {stage.activation_elements} elements, not {total}"


def test_a_pipeline_stage_holds_a_receive_buffer_a_microbatch_for_each_neighbour():
    """torch's pipeline stage allocates, at its setup, a buffer a microbatch for what it receives: the
    previous stage's hidden states (every stage but the first) and the next stage's gradient of them (every
    stage but the last). explain counts them beside each stage's microbatches in flight under 1F1B (the
    first stage ``P``, the last 1): three stages of one layer each, four microbatches (more than any stage's
    warm-up: each holds its gradients beside them); the first stage and the middle one (the last's loss is
    counted apart), each peaking in its block's backward (half a microbatch's block beside: ``BACKWARD_WORKING``)."""
    from shardcore.cost.memory import BACKWARD_WORKING
    from shardcore.cost.search import workload_facts
    from shardcore.cost.tracked import cost_layout, predicted_memory

    model = meta_llama(heads=4, kv=2, layers=3)
    seq, m, hidden = 32, 4, model.config.hidden_size
    itemsize = next(model.parameters()).element_size()
    config = ShardConfig(tensor_parallel_size=1, pipeline_parallel_size=3, num_microbatches=m)
    stages = workload_facts(model, cost_layout(config), seq=seq, batch=m)["stages"]  # the plan's roles at TP=1
    for rank, (stage, in_flight, neighbours) in enumerate(zip(stages[:2], (3, 2), (1, 2), strict=False)):
        per_token = stage.activation_elements * itemsize + 4 * stage.norm_elements
        buffers = neighbours * m * seq * hidden * itemsize  # its input's and its output's gradient's, a microbatch
        found = predicted_memory(model, config, seq=seq, batch=m, rank=rank)["activations"]
        want = int(seq * in_flight * per_token + buffers)  # microbatches in flight under 1F1B: 3 first, 2 middle
        want += int(BACKWARD_WORKING * seq * per_token)  # one block a stage
        what = ("first", "middle")[rank]
        assert found == want, f"the {what} stage's activations {found} B, not {want} B ({buffers} B of buffers)"


def test_a_stage_whose_warm_up_runs_every_microbatch_peaks_where_its_first_backward_holds_the_most():
    """1F1B runs ``min(P - s, M)`` forwards on stage ``s`` before its first backward. Where that is every
    microbatch (the first stage at ``M = P``), no forward runs beside the gradients: the stage peaks in its first
    backward, which walks the parameters in reverse, each gradient allocated before its inputs are freed. A
    dense first stage's largest gradient, the embeddings', comes last: where the gradients outweigh a
    microbatch's activations the peak is the walk's end (every gradient, one microbatch fewer); where they do not,
    its start (every microbatch, the first gradient: the last norm's). Measured on tracked first stages of
    Llama-3's shapes: both counted whole, the peak was 6-14% over; a MoE's experts' gradients come first. The
    block's backward's own working set (``BACKWARD_WORKING``) beside it in both."""
    from shardcore.cost.memory import BACKWARD_WORKING
    from shardcore.cost.search import workload_facts
    from shardcore.cost.tracked import cost_layout, predicted_memory

    model = meta_llama(heads=4, kv=2, layers=2)
    m, hidden = 2, model.config.hidden_size
    itemsize = next(model.parameters()).element_size()
    config = ShardConfig(tensor_parallel_size=1, pipeline_parallel_size=2, num_microbatches=m)
    stage = workload_facts(model, cost_layout(config), seq=8, batch=m)["stages"][0]  # the plan's roles at TP=1
    regimes = []
    for seq in (8, 2048):  # a microbatch's activations below the stage's gradients, then above them
        found = predicted_memory(model, config, seq=seq, batch=m, rank=0)
        one = seq * (stage.activation_elements * itemsize + 4 * stage.norm_elements)
        whole = int(m * one + m * seq * hidden * itemsize)  # both microbatches and the output gradient's buffers
        whole += int(BACKWARD_WORKING * one)  # one block on the stage
        fixed = found["parameters"] + found["optimizer"]
        regimes.append(one < found["gradients"])
        if one < found["gradients"]:  # the walk's end: every gradient, one microbatch fewer
            assert found["activations"] < whole, f"seq {seq}: every microbatch held beside the gradients: {found}"
            assert abs(found["activations"] - (whole - one)) <= 1, f"seq {seq}: the backward's end: {found}"
            peak = fixed + found["gradients"] + found["activations"]  # (or the optimizer step's, above it here)
            assert found["total"] >= peak, f"seq {seq}: the peak below the backward's end, {peak} B: {found}"
        else:  # the walk's start: every microbatch, the last norm's gradient
            assert found["activations"] == whole, f"seq {seq}: the warm-up's activations: {found}"
            first = hidden * itemsize
            assert found["total"] == fixed + whole + first, f"seq {seq}: the peak holds the first gradient: {found}"
    assert regimes == [True, False], "the two sequence lengths no longer fall on either side of the gradients"


def test_the_optimizers_step_is_a_peak_of_its_own():
    """A rank whose activations are small peaks in AdamW's step: the parameters, their gradients and the two
    moments, and beside them torch's temporaries for one tensor at a time (the second moment's square root,
    its quotient, the update), three tensors the size of the largest (here the embedding or the head)."""
    from shardcore.cost.tracked import predicted_memory

    model = meta_llama(heads=4, kv=2, layers=2)
    held = {id(p): p.numel() * p.element_size() for p in model.parameters()}
    params, largest = sum(held.values()), max(held.values())
    found = predicted_memory(model, ShardConfig(tensor_parallel_size=1), seq=8, batch=1)
    want = 4 * params + 3 * largest
    assert found["total"] == want, f"the optimizer step's peak {found['total']} B, not {want} B ({found})"
