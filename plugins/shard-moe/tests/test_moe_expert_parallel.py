"""Expert parallelism (``ShardConfig(expert_parallel_size=E)``, carved from the data-parallel ranks)
against the unsharded model, on real gloo ranks: each rank trains on its part of the global batch.
By default the router's load-balancing loss is each part's, so the reference is the unsharded
model's mean loss over the parts (each its own forward); with ``global_batch_balance=True`` it is
the whole batch's, so the reference is the unsharded loss on the whole batch. The kit checks the
mean loss, every gradient gathered and as each rank holds it, 3 AdamW steps, and that the copies
of each weight (dense ones over dp, experts over the ranks holding the same experts) stay equal."""

from __future__ import annotations

import pytest
import torch
from moe_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import (
    assert_clipping_matches,
    assert_data_parallel_matches,
    assert_explain_matches,
    assert_lazy_load_matches,
    assert_resume_matches,
    assert_save_pretrained_matches,
    refusal_message,
    run_on_ranks,
    train_and_save,
)


def _fused_experts() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


pytestmark = pytest.mark.skipif(
    not _fused_experts(),
    reason="transformers 4.x: refused by name (test_moe_tp.py::test_transformers_4_refused_by_name)",
)


def _ep(ep: int, tp: int, dp_mode: str = "ddp", **extra) -> ShardConfig:
    return ShardConfig(tensor_parallel_size=tp, expert_parallel_size=ep, data_parallel=dp_mode, **extra)


def _check(family: str, cfg: dict, config: ShardConfig, batch: dict) -> dict:
    from shardcore.tensor_parallel import count_collectives

    parts = not config.global_batch_balance
    with count_collectives() as counts:
        report = assert_data_parallel_matches(
            lambda: build(family, **cfg), batch, config, reference_on_parts=parts, rtol_loss=2e-6
        )
    report["counts"] = dict(counts)
    torch.manual_seed(0)  # the kit's model (its seed): which experts the unsharded router picks, per layer
    with torch.no_grad():
        out = build(family, **cfg)(**batch)
    k = cfg.get("top_k", 2)
    report["experts_hit"] = [len(set(r.topk(k, dim=-1).indices.flatten().tolist())) for r in out.router_logits]
    return report


CASES = {
    "mixtral-ep2": ("mixtral", {}, 2, _ep(2, 1), {}),
    "mixtral-ep2-padded": ("mixtral", {}, 2, _ep(2, 1), {"pad": True}),
    "mixtral-ep2-global-balance": ("mixtral", {}, 2, _ep(2, 1, global_batch_balance=True), {}),
    "mixtral-ep2-top1-uneven": ("mixtral", {"experts": 8, "top_k": 1}, 2, _ep(2, 1), {}),
    # 16 experts, top-2, 8 tokens a row: in both layers some experts get no token of the whole batch
    "mixtral-ep2-top2-uneven": ("mixtral", {"experts": 16}, 2, _ep(2, 1), {"seq": 8}),
    "mixtral-ep2xtp2-top2-uneven": ("mixtral", {"experts": 16}, 4, _ep(2, 2), {"seq": 8}),
    "qwen2-moe-ep2": ("qwen2_moe", {}, 2, _ep(2, 1), {}),
    "qwen3-moe-ep2": ("qwen3_moe", {}, 2, _ep(2, 1), {}),
    "olmoe-ep2": ("olmoe", {}, 2, _ep(2, 1), {}),
    "mixtral-ep2-fsdp-global": ("mixtral", {}, 2, _ep(2, 1, "fsdp", global_batch_balance=True), {}),
    "mixtral-ep2xtp2": ("mixtral", {}, 4, _ep(2, 2), {}),
    "mixtral-ep2xtp2-global-top1": ("mixtral", {"experts": 8, "top_k": 1}, 4, _ep(2, 2, global_batch_balance=True), {}),
    "mixtral-ep2-dp4": ("mixtral", {}, 4, _ep(2, 1), {}),  # two copies of each expert: summed over them
    "qwen2-moe-ep2xtp2": ("qwen2_moe", {}, 4, _ep(2, 2), {}),
    "qwen3-moe-ep2xtp2": ("qwen3_moe", {}, 4, _ep(2, 2), {}),
    "olmoe-ep2xtp2": ("olmoe", {}, 4, _ep(2, 2), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_unsharded(case):
    family, cfg, ranks, config, batch_kw = CASES[case]
    batch = lm_batch(batch=4, seq=batch_kw.get("seq", 12), pad=batch_kw.get("pad", False))
    experts = cfg.get("experts", 4)
    for report in run_on_ranks(ranks, _check, family, cfg, config, batch):
        assert "max_abs_diff_after_steps" in report, report
        assert report["counts"]["all_to_all"] > 0, report  # the tokens travelled
        if "uneven" in case:  # in some layer some expert gets no token of the whole batch
            assert min(report["experts_hit"]) < experts, report["experts_hit"]


def test_global_batch_balance_is_not_the_parts_loss():
    """The two references differ on this batch (so each case above tells the modes apart): the
    whole batch's load-balancing loss is not the mean of the parts'."""
    torch.manual_seed(0)
    model = build("mixtral")
    batch = lm_batch(batch=4, pad=False)
    with torch.no_grad():
        whole = model(**batch).aux_loss
        parts = [model(**{k: v[i * 2 : i * 2 + 2] for k, v in batch.items()}).aux_loss for i in range(2)]
    assert abs(float(whole) - float(sum(parts) / 2)) > 1e-4


def _expert_bytes(ep: int, tp: int) -> dict:
    import shardcore
    from shardcore.expert_parallel import expert_modules

    torch.manual_seed(0)
    full = sum(
        p.numel() * p.element_size() for n, p in build("mixtral", experts=8).named_parameters() if ".experts." in n
    )
    model = shardcore.optimize(build("mixtral", experts=8), _ep(ep, tp))
    mine = sum(p.numel() * p.element_size() for m in expert_modules(model) for p in m.parameters())
    return {"fraction": mine / full, "repr": repr(expert_modules(model)[0])}


@pytest.mark.parametrize(("ranks", "ep", "tp"), [(2, 2, 1), (4, 2, 2), (4, 4, 1)])
def test_each_rank_holds_its_share_of_the_experts(ranks, ep, tp):
    """Per-rank expert bytes: 1 / (ep x tp) of the unsharded experts' (the issue's bound: 1/E + 5%)."""
    for report in run_on_ranks(ranks, _expert_bytes, ep, tp):
        assert report["fraction"] == pytest.approx(1 / (ep * tp)), report
        assert report["fraction"] <= 1 / ep + 0.05 and "(expert parallel)" in report["repr"]


def _clip() -> dict:
    config = _ep(2, 1, global_batch_balance=True)  # the whole batch's loss: torch's clip on the unsharded model
    return assert_clipping_matches(lambda: build("mixtral"), lm_batch(batch=4, pad=False), config)


def test_clip_grad_norm_matches_unsharded():
    """torch.nn.utils.clip_grad_norm_ on the user's side: the experts' squares summed over the ranks
    holding them, the dense weights' counted once (each replica holds them whole)."""
    for report in run_on_ranks(2, _clip):
        assert report, report


def _saved(path: str) -> dict:
    config = _ep(2, 1, global_batch_balance=True)  # trained one step as the unsharded model on the whole batch
    return assert_save_pretrained_matches(lambda: build("mixtral"), lm_batch(batch=4, pad=False), config, path)


def test_save_pretrained_then_from_pretrained(tmp_path):
    """save_pretrained gathers each expert from the rank holding it; from_pretrained reads it back whole."""
    run_on_ranks(2, _saved, str(tmp_path / "saved"))


def _generate() -> list:
    """Each rank generates its own prompts (different lengths of output are possible): transformers'
    synced generation keeps the ranks' forwards (and their all-to-alls) in step."""
    import torch.distributed as dist

    import shardcore

    torch.manual_seed(0)
    ref = build("mixtral", output_router_logits=False).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build("mixtral", output_router_logits=False), _ep(2, 1)).eval()
    batch = lm_batch(batch=4, pad=True)
    rank = dist.get_rank()
    prompt = {k: batch[k][rank * 2 : rank * 2 + 2] for k in ("input_ids", "attention_mask")}
    kwargs = {"max_new_tokens": 6 + 3 * rank, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    with torch.no_grad():
        want = ref.generate(**prompt, **kwargs)
        got = model.generate(**prompt, **kwargs)
    assert torch.equal(got, want), (got, want)
    return got.tolist()


def test_generate_matches_unsharded():
    """Greedy generate with a KV cache at EP=2, each rank its own prompts and length of output."""
    tokens = run_on_ranks(2, _generate)
    assert tokens[0] != tokens[1]


def _lazy_ep(ckpt: str, out: str) -> dict:
    """Meta build, EP=2, load_checkpoint from transformers 5's per-expert layout: equal outputs, and
    the expert pieces this rank read (positioned reads, counted)."""
    from shardcore.testing import rows_read

    with rows_read() as rows:  # every piece of a stacked tensor is read by rows
        assert_lazy_load_matches(lambda: build("mixtral"), lm_batch(), ckpt, _ep(2, 1), save_to=out)
    read = [key for key, _ in rows]
    return {"experts": sorted({k.split(".experts.")[1].split(".")[0] for k in read if ".experts." in k})}


def test_checkpoint_read_on_shard_under_expert_parallelism(tmp_path):
    """Each expert-parallel rank reads its own experts' pieces only, onto the meta-built model;
    save_checkpoint then gathers every expert from its owner (from_pretrained reads the same model)."""
    torch.manual_seed(0)
    build("mixtral").save_pretrained(tmp_path / "ckpt")
    reads = run_on_ranks(2, _lazy_ep, str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert [r["experts"] for r in reads] == [["0", "1"], ["2", "3"]], reads
    torch.manual_seed(0)
    ref = build("mixtral").eval()
    back = type(ref).from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert torch.allclose(back(**lm_batch()).logits, ref(**lm_batch()).logits, atol=1e-6)


def _dcp(path: str, resume: dict) -> float:
    batches = [lm_batch(batch=4, pad=False, seed=s) for s in (1, 2, 3)]
    build_fn = lambda: build("mixtral")  # noqa: E731
    train_and_save(build_fn, batches[:2], _ep(2, 1, global_batch_balance=True), path)
    return assert_resume_matches(build_fn, batches[:2], batches[2:], ShardConfig(**resume), path)


@pytest.mark.parametrize(
    "resume",
    [
        {"tensor_parallel_size": 1, "expert_parallel_size": 2, "data_parallel": "ddp", "global_batch_balance": True},
        {"tensor_parallel_size": 2},
    ],
    ids=["ep2-to-ep2", "ep2-to-tp2"],
)
def test_distributed_checkpoint_resumes(resume, tmp_path):
    """save_distributed at EP=2 (model and AdamW state), load_distributed at EP=2 and at TP=2 (the
    experts regrouped), training on as the unsharded model trained without interruption."""
    run_on_ranks(2, _dcp, str(tmp_path / "dcp"), resume)


def _explain(ep: int, tp: int) -> dict:
    return assert_explain_matches(lambda: build("mixtral"), lm_batch(), _ep(ep, tp))


@pytest.mark.parametrize(("ranks", "ep", "tp"), [(2, 2, 1), (4, 2, 2)])
def test_explain_predicts_a_step(ranks, ep, tp):
    """explain --ep: the all-to-alls (3 forward, 2 backward per layer) and the tensor-parallel
    collectives a real step issues, and rank 0's bytes (its share of the experts)."""
    report = run_on_ranks(ranks, _explain, ep, tp)[0]
    per_layer = report["collectives_per_layer"]["MixtralDecoderLayer"]
    assert per_layer["forward"]["all_to_all"] == 3 and per_layer["backward"]["all_to_all"] == 2, per_layer
    # counted by hand: 2 layers x (4 experts / ep) x 3 matrices of 64 x 96 (split over tp), fp32
    want = 2 * (4 // ep) * 3 * 64 * 96 // tp * 4
    assert report["experts"]["layers"] == 2, report["experts"]
    assert report["experts"]["expert_bytes_per_rank"] == want, (
        f"explain says rank 0 holds {report['experts']['expert_bytes_per_rank']} bytes of experts, not {want}"
    )


def test_the_example_loop_equals_the_unsharded_loop():
    """examples/expert_parallel_training.py (the docs include its loop) on 2 real ranks."""
    import pathlib

    from shardcore.testing import example_main

    example = example_main(pathlib.Path(__file__).resolve().parents[3] / "examples" / "expert_parallel_training.py")
    unsharded = example(["--unsharded"])
    for got in run_on_ranks(2, example, []):
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, unsharded, strict=True)), (got, unsharded)


def _refused(config: dict, cfg: dict, model: str = "causal") -> str:
    import transformers
    from moe_cases import moe_config

    def make():
        if model == "base":
            return transformers.MixtralModel(moe_config("mixtral", **cfg))
        return build("mixtral", **cfg)

    return refusal_message(make, ShardConfig(**config))


@pytest.mark.parametrize(
    ("ranks", "config", "cfg", "model", "expected"),
    [
        (2, {"expert_parallel_size": 2}, {}, "causal", "tensor_parallel_size=None took every rank left"),
        (2, {"expert_parallel_size": 2, "tensor_parallel_size": 1}, {}, "causal", "set data_parallel='ddp' or 'fsdp'"),
        (
            4,
            {"expert_parallel_size": 4, "tensor_parallel_size": 2, "data_parallel": "ddp"},
            {},
            "causal",
            "ep=4 does not divide the data-parallel degree",
        ),
        (
            2,
            {"expert_parallel_size": 2, "tensor_parallel_size": 1, "data_parallel": "ddp"},
            {"experts": 3, "heads": 4, "kv": 4},
            "causal",
            "num_experts=3 do not split over expert_parallel_size=2",
        ),
        (
            2,
            {
                "expert_parallel_size": 2,
                "tensor_parallel_size": 1,
                "data_parallel": "ddp",
                "global_batch_balance": True,
            },
            {},
            "base",
            "MixtralModel computes no load-balancing loss",
        ),
    ],
    ids=["tp-takes-the-rest", "no-data-parallel", "ep-not-dividing-dp", "experts-not-dividing", "balance-without-loss"],
)
def test_refused_on_every_rank_before_any_collective(ranks, config, cfg, model, expected):
    for message in run_on_ranks(ranks, _refused, config, cfg, model):
        assert expected in message, message
