"""Llama with Megatron sequence parallelism (split_gather over the TP group): outputs, loss and
every gradient equal to the unsharded model; the split really runs (reduce-scatters counted)."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import assert_generate_matches, assert_outputs_close, assert_sharded_matches, run_on_ranks

SP = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "split_gather"}


def _refused_before_v5(world: int, config: dict, cls_name: str = "LlamaForCausalLM") -> bool:
    """transformers 4.x has no attention and mask registries for all_to_all / ring_attn: there the
    mode is refused by name before any collective, which is checked instead (``True``)."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return False
    mode = config["sequence_parallelism_mode"]
    for message in run_on_ranks(world, _refused, {k: v for k, v in config.items() if k != "kv"}, cls_name):
        assert message.startswith("NotImplementedError") and mode in message and "registr" in message, message
    return True


def _check(tp: int, cls_name: str, cfg: dict, overlap: bool = False) -> dict:
    batch = lm_batch(cfg.get("vocab", 128), seq=12)  # 12 tokens: 6 or 3 per rank
    if cls_name.endswith("SequenceClassification"):
        batch["labels"] = torch.tensor([1, 0])
    config = ShardConfig(tensor_parallel_size=tp, enable_sequence_overlap=overlap, **SP)
    return assert_sharded_matches(lambda: build(cls_name, **cfg), batch, config)


@pytest.mark.parametrize(
    ("tp", "cls_name", "cfg", "overlap"),
    [
        (2, "LlamaForCausalLM", {}, False),
        (4, "LlamaForCausalLM", {"kv": 2, "tie": True}, False),  # replicated K/V heads, tied embeddings
        (2, "LlamaForCausalLM", {}, True),
        (4, "LlamaForCausalLM", {"kv": 2, "tie": True}, True),
    ],
    ids=["causal-tp2", "causal-gqa-tied-tp4", "causal-tp2-overlap", "causal-gqa-tied-tp4-overlap"],
)
def test_split_gather_matches_unsharded(tp, cls_name, cfg, overlap):
    for report in run_on_ranks(tp, _check, tp, cls_name, cfg, overlap):
        assert "max_abs_diff_after_steps" in report, report


def _registry_mid_forward() -> list:
    """Inside a split forward, every norm's registered parameters are the real leaves (what an
    optimizer, a state dict or FSDP sees), while its forward reads their gradient-summing copy."""
    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(tensor_parallel_size=2, **SP))
    leaves = {n: p for n, p in model.named_parameters()}
    seen = []

    def look(module, args, output):
        real = module._parameters["weight"]
        seen.append((real.is_leaf, real is leaves[f"{names[module]}.weight"], module.weight is not real))

    names = {m: n for n, m in model.named_modules()}
    norm = model.model.layers[0].input_layernorm
    handle = norm.register_forward_hook(look, prepend=True)  # before the hook that ends the shadow
    model(**lm_batch(seq=12)).loss.backward()
    handle.remove()
    assert all(p is leaves[n] for n, p in model.named_parameters())  # nothing swapped after it either
    assert "weight" not in norm.__dict__
    return seen


def test_a_split_forward_never_swaps_registered_parameters():
    for seen in run_on_ranks(2, _registry_mid_forward):
        assert seen == [(True, True, True)], seen


def _generate() -> list:
    import shardcore

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM").eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(tensor_parallel_size=2, **SP)).eval()
    ids = torch.randint(1, 128, (2, 8), generator=torch.Generator().manual_seed(3))
    return assert_generate_matches(ref, model, input_ids=ids, max_new_tokens=6, do_sample=False).tolist()


def test_generate_prefill_split_decode_unsplit():
    tokens = run_on_ranks(2, _generate)
    assert tokens[0] == tokens[1]


# -- all_to_all (DeepSpeed-Ulysses) over sequence_parallel_size ranks, alone and with TP ---------------

ULYSSES = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "all_to_all"}


def _check_ulysses(tp: int, sp: int, cls_name: str, cfg: dict) -> dict:
    batch = lm_batch(cfg.get("vocab", 128), seq=12)
    if cls_name.endswith("SequenceClassification"):
        batch["labels"] = torch.tensor([1, 0])
    config = ShardConfig(tensor_parallel_size=tp, sequence_parallel_size=sp, **ULYSSES)
    with count_collectives() as counts:
        report = assert_sharded_matches(lambda: build(cls_name, **cfg), batch, config)
    report["all_to_all"] = counts.get("all_to_all", 0)
    return report


@pytest.mark.parametrize(
    ("tp", "sp", "cls_name", "cfg"),
    [
        (1, 4, "LlamaForCausalLM", {"tie": True}),
        (2, 2, "LlamaForCausalLM", {}),  # sp x tp on the mesh
        # 8 heads, 4 KV: sp=2 splits each exchanged tensor's heads twice over (mutant ulysses-backward-swapped)
        (1, 2, "LlamaForSequenceClassification", {"heads": 8, "kv": 4}),
    ],
    ids=["causal-tied-sp4", "causal-sp2-tp2", "seqcls-gqa-sp2"],
)
def test_all_to_all_matches_unsharded(tp, sp, cls_name, cfg):
    if _refused_before_v5(tp * sp, {**ULYSSES, "tensor_parallel_size": tp, "sequence_parallel_size": sp}, cls_name):
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    for report in run_on_ranks(tp * sp, _check_ulysses, tp, sp, cls_name, cfg):
        assert "max_abs_diff_after_steps" in report, report
        assert report["all_to_all"] > 0, report  # the heads were exchanged: the sequence was split


def _generate_ulysses() -> list:
    import shardcore

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM").eval()
    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=1, sequence_parallel_size=2, **ULYSSES)
    model = shardcore.optimize(build("LlamaForCausalLM"), config).eval()
    ids = torch.randint(1, 128, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # a forward without a cache is split; generate's cached steps run unsplit
        assert_outputs_close(model(input_ids=ids).logits, ref(input_ids=ids).logits, "Ulysses logits")
    return assert_generate_matches(ref, model, input_ids=ids, max_new_tokens=6, do_sample=False).tolist()


def test_all_to_all_forward_and_generate():
    if _refused_before_v5(2, {**ULYSSES, "tensor_parallel_size": 1, "sequence_parallel_size": 2}):
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    tokens = run_on_ranks(2, _generate_ulysses)
    assert tokens[0] == tokens[1]


# -- ring_attn: zigzag-balanced context parallelism (key/value blocks passed around the ring) ---------

RING = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "ring_attn"}


def _check_ring(tp: int, sp: int, cfg: dict, pad: bool) -> dict:
    batch = lm_batch(cfg.get("vocab", 128), seq=16, pad=pad)  # 16 tokens: 4 chunks of 4 (sp=2), 8 of 2 (sp=4)
    config = ShardConfig(tensor_parallel_size=tp, sequence_parallel_size=sp, **RING)
    with count_collectives() as counts:
        report = assert_sharded_matches(lambda: build("LlamaForCausalLM", **cfg), batch, config)
    report["ring_shift"] = counts.get("ring_shift", 0)
    return report


@pytest.mark.parametrize(
    ("tp", "sp", "cfg", "pad"),
    [
        (1, 2, {"kv": 2}, True),
        (1, 4, {"tie": True}, False),
        (1, 4, {"heads": 6, "kv": 2, "hidden": 48}, True),  # 3 query heads per key/value head
        (2, 2, {}, True),
        (2, 2, {"kv": 2}, False),
    ],
    ids=["gqa-padded-sp2", "tied-causal-sp4", "odd-groups-padded-sp4", "padded-sp2-tp2", "gqa-causal-sp2-tp2"],
)
def test_ring_attn_matches_unsharded(tp, sp, cfg, pad):
    if _refused_before_v5(tp * sp, {**RING, "tensor_parallel_size": tp, "sequence_parallel_size": sp}):
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    for report in run_on_ranks(tp * sp, _check_ring, tp, sp, cfg, pad):
        # the blocks went around the ring: sp - 1 shifts per attention forward, sp per backward
        assert "max_abs_diff_after_steps" in report and report["ring_shift"] > 0, report


def _check_all_gather_kv(tp: int, sp: int) -> dict:
    batch = lm_batch(128, seq=16, pad=True)
    config = ShardConfig(
        tensor_parallel_size=tp, sequence_parallel_size=sp, **{**RING, "sequence_parallelism_mode": "all_gather_kv"}
    )
    with count_collectives() as counts:
        report = assert_sharded_matches(lambda: build("LlamaForCausalLM", kv=2), batch, config)
    report["ring_shift"], report["all_gather"] = counts.get("ring_shift", 0), counts.get("all_gather", 0)
    return report


@pytest.mark.parametrize(("tp", "sp"), [(1, 2), (1, 4)], ids=["sp2", "sp4"])
def test_all_gather_kv_matches_unsharded(tp, sp):
    """The same zigzag split as ring_attn, the keys and values all-gathered (no ring step)."""
    if _refused_before_v5(tp * sp, {**RING, "tensor_parallel_size": tp, "sequence_parallel_size": sp}):
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    for report in run_on_ranks(tp * sp, _check_all_gather_kv, tp, sp):
        assert "max_abs_diff_after_steps" in report, report
        assert report["ring_shift"] == 0 and report["all_gather"] > 0, report


def _check_ring_gathered() -> dict:
    """The path for what the ring does not compute (attention dropout, sliding windows, soft-capping,
    sinks), forced here for a kwarg every Llama attention passes: keys and values gathered."""
    import shardcore.sequence.ring as ring

    saved, ring.GATHERED_FOR = ring.GATHERED_FOR, ("scaling",)
    try:
        return _check_ring(1, 2, {"kv": 2}, True)
    finally:
        ring.GATHERED_FOR = saved


def test_ring_attn_gathered_path_matches_unsharded():
    if _refused_before_v5(2, {**RING, "tensor_parallel_size": 1, "sequence_parallel_size": 2}):
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    for report in run_on_ranks(2, _check_ring_gathered):
        assert "max_abs_diff_after_steps" in report and report["ring_shift"] == 0, report


def test_ring_attn_zigzag_balances_causal_work():
    from shardcore.sequence import zigzag_positions

    for sp in (2, 4):
        positions = zigzag_positions(32, sp).view(sp, -1)
        work = (positions + 1).sum(dim=1)  # keys each rank's queries attend to under a causal mask
        assert torch.equal(work, work[:1].expand(sp)), work
        assert sorted(positions.flatten().tolist()) == list(range(32))


def _refused(config: dict, cls_name: str = "LlamaForCausalLM") -> str:
    from shardcore.testing import refusal_message

    config = {"tensor_parallel_size": 2, **config}
    kv = config.pop("kv", None)
    return refusal_message(lambda: build(cls_name, kv=kv), ShardConfig(**config))


@pytest.mark.parametrize(
    ("config", "cls_name", "expected"),
    [
        (
            {**ULYSSES, "tensor_parallel_size": 1, "sequence_parallel_size": 2, "kv": 1},
            "LlamaForCausalLM",
            "1 key/value heads do not split over tensor_parallel_size x sequence_parallel_size = 1 x 2",
        ),
        ({"tensor_parallel_size": 1, "sequence_parallel_size": 2}, "LlamaForCausalLM", "without sequence parallel"),
        ({**SP, "tensor_parallel_size": 1, "sequence_parallel_size": 2}, "LlamaForCausalLM", "is the group of"),
        (
            {**ULYSSES, "tensor_parallel_size": 1, "sequence_parallel_size": 2, "enable_sequence_overlap": True},
            "LlamaForCausalLM",
            "overlaps the collectives of sequence_parallelism_mode='split_gather'; with 'all_to_all' leave it False",
        ),
        ({**SP, "enable_jit_fused": True}, "LlamaForCausalLM", "enable_jit_fused (compiled modules) is not built"),
    ],
    ids=[
        "ulysses-heads",
        "sp-without-mode",
        "split-gather-sp",
        "overlap",
        "jit",
    ],  # other families: their plugins
)
def test_refused_on_every_rank_before_any_collective(config, cls_name, expected):
    if cls_name.startswith("Llama") and config.get("sequence_parallelism_mode") in ("all_to_all", "ring_attn"):
        if "enable_sequence_overlap" not in config and _refused_before_v5(2, {"tensor_parallel_size": 2, **config}):
            pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    for message in run_on_ranks(2, _refused, config, cls_name):
        assert expected in message, message


def _sizes(mode: str) -> dict:
    if mode == "split_gather":
        return {"tensor_parallel_size": 2}
    return {"tensor_parallel_size": 1, "sequence_parallel_size": 2}


def _hidden_states_refused(mode: str) -> str:
    import shardcore

    torch.manual_seed(0)
    config = ShardConfig(**_sizes(mode), enable_sequence_parallelism=True, sequence_parallelism_mode=mode)
    model = shardcore.optimize(build("LlamaForCausalLM"), config)
    try:
        model(**lm_batch(seq=12), output_hidden_states=True)
    except NotImplementedError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("mode", ["split_gather", "all_to_all"])
def test_hidden_states_refused_at_the_forward(mode):
    over_sp = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": mode}
    if mode != "split_gather" and _refused_before_v5(2, {**over_sp, **_sizes(mode)}):
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    for hidden in run_on_ranks(2, _hidden_states_refused, mode):
        assert "output_hidden_states would return each rank's slice" in hidden, hidden


def _checkpointed(mode: str, reentrant: bool) -> dict:
    built = []

    def checkpointed():
        model = build("LlamaForCausalLM")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        built.append(model)
        return model

    config = ShardConfig(**_sizes(mode), enable_sequence_parallelism=True, sequence_parallelism_mode=mode)
    report = assert_sharded_matches(checkpointed, lm_batch(seq=12), config)
    (sharded,) = [model for model in built if getattr(model, "shardcore", None) is not None]
    # the blocks really ran through HF's checkpoint function, which shardcore wrapped (transformers 5
    # gives each layer one, 4.x the decoder stack)
    holders = [m for m in sharded.modules() if "_gradient_checkpointing_func" in m.__dict__]
    report["carried"] = bool(holders) and all(
        getattr(m._gradient_checkpointing_func, "shardcore_carries", False) for m in holders
    )
    return report


@pytest.mark.parametrize(
    ("mode", "reentrant"), [("split_gather", False), ("split_gather", True), ("all_to_all", False)]
)
def test_gradient_checkpointing_matches_unsharded(mode, reentrant):
    """HuggingFace's gradient checkpointing under sequence parallelism: each recomputed block runs
    split as its forward did; outputs, loss and every gradient equal the unsharded model's."""
    over_sp = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": mode}
    if mode != "split_gather" and _refused_before_v5(2, {**over_sp, **_sizes(mode)}):
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    for report in run_on_ranks(2, _checkpointed, mode, reentrant):
        assert "max_abs_diff_after_steps" in report, report
        assert report["carried"], report


def test_explain_says_split_gather_changes_its_counts():
    """explain counts tensor parallelism's collectives; under split_gather it says what replaces them."""
    from shardcore.explain import explain

    report = explain(_meta(), 2, config=ShardConfig(tensor_parallel_size=2, enable_sequence_overlap=True, **SP))
    (note,) = [n for n in report["notes"] if "split_gather" in n]
    assert "reduce-scatters its gradient" in note and "2 reduce-scatters per exit" in note
    plain = explain(_meta(), 2, config=ShardConfig(tensor_parallel_size=2))
    assert not any("split_gather" in n for n in plain["notes"])
    assert report["collectives_per_step"] == plain["collectives_per_step"]


def _meta():
    import shardcore

    with shardcore.init_empty():
        return build("LlamaForCausalLM")


def _explain_over_sp(mode: str, tp: int, sp: int) -> dict:
    from shardcore.testing import assert_explain_matches

    config = ShardConfig(
        tensor_parallel_size=tp,
        sequence_parallel_size=sp,
        enable_sequence_parallelism=True,
        sequence_parallelism_mode=mode,
    )
    return assert_explain_matches(lambda: build("LlamaForCausalLM", heads=8, kv=4), lm_batch(seq=16), config)


@pytest.mark.parametrize(
    ("mode", "tp", "sp"),
    [("ring_attn", 1, 2), ("all_gather_kv", 1, 2), ("all_to_all", 1, 2), ("ring_attn", 2, 2)],
    ids=["ring-sp2", "all-gather-kv-sp2", "ulysses-sp2", "ring-tp2-sp2"],
)
def test_explain_predicts_a_step_over_sp(mode, tp, sp):
    """explain counts the sp dim's collectives (the mode's per attention, the gradient sums, the
    sequence's gather) as a real step issues them."""
    if _refused_before_v5(tp * sp, {**RING, "tensor_parallel_size": tp, "sequence_parallel_size": sp}):
        pytest.skip("transformers 4.x: refused by name (checked above); the parity check needs transformers 5")
    report = run_on_ranks(tp * sp, _explain_over_sp, mode, tp, sp)[0]
    per_layer = report["collectives_per_layer"]["LlamaDecoderLayer"]
    kind = {"ring_attn": "ring_shift", "all_gather_kv": "all_gather", "all_to_all": "all_to_all"}[mode]
    assert per_layer["forward"][kind] > 0, per_layer
