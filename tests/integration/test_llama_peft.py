"""PEFT LoRA on a sharded Llama, in both orders (LoRA then optimize, optimize then LoRA): loss and
every LoRA gradient equal the unsharded PeftModel's, only LoRA trains, the merged model saves
unsharded, the adapter saved from the sharded model loads onto the unsharded base."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import run_on_ranks

CFG = {"kv": 2, "vocab": 1001}  # at TP=4 the KV heads (v_proj) are replicated
TARGETS = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]  # column and row layers


def _lora(model):
    import peft

    torch.manual_seed(1)  # the adapters' random init: the same draws on every rank and in the reference
    # init_lora_weights=False: B random too, so that every LoRA gradient is non-zero and testable
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False)
    return peft.get_peft_model(model, config)


def _sharded(order: str, tp: int):
    import shardcore

    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=tp)
    if order == "lora-then-optimize":
        return shardcore.optimize(_lora(build("LlamaForCausalLM", **CFG)), config)
    return _lora(shardcore.optimize(build("LlamaForCausalLM", **CFG), config))


def _check(order: str, tp: int, out: str) -> dict:
    import transformers

    import shardcore

    torch.manual_seed(0)
    ref = _lora(build("LlamaForCausalLM", **CFG))
    model = _sharded(order, tp)
    batch = lm_batch(1001)
    loss_ref, loss = ref(**batch).loss, model(**batch).loss
    loss_ref.backward()
    loss.backward()
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    frozen = sorted(set(trainable) ^ {n for n, p in ref.named_parameters() if p.requires_grad})
    assert not frozen, f"trainable here and frozen in the unsharded PEFT model, or the reverse: {frozen[:3]}"
    assert trainable and all(".lora_" in n for n in trainable), trainable
    report = {"loss": loss.item(), "loss_unsharded": loss_ref.item(), "lora_params": len(trainable)}
    assert abs(loss.item() - loss_ref.item()) <= 1e-6 * abs(loss_ref.item()), report
    want = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad}
    worst = 0.0
    for name, grad in shardcore.full_named_tensors(model, grads=True):
        if name in want:
            rel = ((grad - want[name]).norm() / want[name].norm()).item()
            assert want[name].norm() > 0 and rel <= 1e-5, (name, rel)
            worst = max(worst, rel)
    report["max_rel_err_lora_grads"] = worst
    # the user's own torch.nn.utils.get_total_norm (what clip_grad_norm_ clips by): the unsharded norm
    norm, norm_ref = (
        torch.nn.utils.get_total_norm([p.grad for p in m.parameters() if p.grad is not None]) for m in (model, ref)
    )
    report["norm_rel_diff"] = ((norm - norm_ref).abs() / norm_ref).item()
    assert report["norm_rel_diff"] <= 1e-5, f"torch's norm of the LoRA gradients is not the unsharded one: {report}"
    # the adapter saved from the sharded model is the unsharded model's adapter
    import torch.distributed as dist

    model.save_pretrained(f"{out}/adapter", is_main_process=dist.get_rank() == 0)
    dist.barrier()
    import peft

    torch.manual_seed(0)
    loaded = peft.PeftModel.from_pretrained(build("LlamaForCausalLM", **CFG), f"{out}/adapter")
    with torch.no_grad():
        report["adapter_logits_diff"] = (loaded(**batch).logits - ref(**batch).logits).abs().max().item()
    # merged, then saved with HF's call on every rank: the unsharded merged model
    merged = model.merge_and_unload()
    merged.save_pretrained(f"{out}/merged")
    again = transformers.LlamaForCausalLM.from_pretrained(f"{out}/merged")
    want_merged = ref.merge_and_unload().state_dict()
    report["merged_weights_diff"] = max((t - want_merged[n]).abs().max().item() for n, t in again.state_dict().items())
    return report


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("order", ["lora-then-optimize", "optimize-then-lora"])
def test_lora_matches_unsharded_peft_model(order, tp, tmp_path):
    reports = run_on_ranks(tp, _check, order, tp, str(tmp_path))
    print(f"\n{order} TP={tp}: {reports[0]}")
    for r in reports:
        assert r["adapter_logits_diff"] <= 1e-5 and r["merged_weights_diff"] <= 1e-6, r


def _merge_before_forward(tp: int) -> float:
    torch.manual_seed(0)
    want = _lora(build("LlamaForCausalLM", **CFG)).merge_and_unload()
    merged = _sharded("optimize-then-lora", tp).merge_and_unload()  # no forward ran: peft's layers cut when set in
    import shardcore

    full = dict(shardcore.full_named_tensors(merged))
    return max((full[n] - t).abs().max().item() for n, t in want.state_dict().items() if n in full)


def test_merge_and_unload_before_any_forward():
    for diff in run_on_ranks(2, _merge_before_forward, 2):
        assert diff <= 1e-6, diff


def _refused(config: dict) -> str:
    from shardcore.testing import refusal_message

    return refusal_message(lambda: _lora(build("LlamaForCausalLM", **CFG)), ShardConfig(**config))


@pytest.mark.parametrize(
    "config",
    [
        {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"},
        {"tensor_parallel_size": 2, "enable_sequence_parallelism": True, "sequence_parallelism_mode": "split_gather"},
    ],
    ids=["fsdp", "split-gather"],
)
def test_lora_where_not_built_is_refused_before_any_collective(config):
    world = config["tensor_parallel_size"] * config.get("data_parallel_size", 1)
    fix = "use data_parallel='ddp'" if "data_parallel" in config else "not supported yet"
    for message in run_on_ranks(world, _refused, config):
        assert "LoRA adapters on a sharded LlamaForCausalLM" in message and fix in message, message


def _lora_ddp() -> dict:
    """LoRA x DDP x TP 2x2 (adapters added, then optimize): each data-parallel rank on its half of the batch; the
    mean loss, every LoRA gradient and the LoRA weights after 3 AdamW steps equal the unsharded PeftModel's on
    the whole batch."""
    import torch.distributed as dist

    import shardcore
    from shardcore.testing import dp_part

    torch.manual_seed(0)
    ref = _lora(build("LlamaForCausalLM", **CFG))
    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel="ddp")
    model = shardcore.optimize(_lora(build("LlamaForCausalLM", **CFG)), config)
    batch = lm_batch(1001, batch=4, pad=False)  # equal label counts in both halves
    layout = model.shardcore.layout
    mine = dp_part(batch, layout.coordinates(dist.get_rank())["dp"], layout.dp)
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3) for m in (ref, model)]
    report = {"loss": [], "grad": 0.0}
    for step in range(3):
        loss_ref, loss = ref(**batch).loss, model(**mine).loss
        loss_ref.backward()
        loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=layout.group("dp"))
        report["loss"].append(abs(mean.item() / layout.dp - loss_ref.item()) / loss_ref.item())
        if step == 0:
            want = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad}
            got = {n: g for n, g in shardcore.full_named_tensors(model, grads=True) if n in want}
            assert set(got) == set(want), sorted(set(want) - set(got))
            report["grad"] = max(((got[n] - want[n]).norm() / want[n].norm()).item() for n in want)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    expected = dict(ref.named_parameters())
    report["step"] = max(
        (full - expected[n]).abs().max().item() for n, full in shardcore.full_named_tensors(model) if ".lora_" in n
    )
    return report


def test_lora_with_ddp_x_tp_trains_like_the_unsharded_peft_model_on_the_whole_batch():
    for r in run_on_ranks(4, _lora_ddp):
        assert max(r["loss"]) <= 1e-6 and r["grad"] <= 1e-5 and r["step"] <= 1e-5, r
