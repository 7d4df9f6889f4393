"""HuggingFace's Trainer on a sharded Llama: ``shardcore.hf.Trainer`` trains like a one-process
``transformers.Trainer`` on the same data (losses per step, weights after N steps, with gradient
accumulation, clipping and a learning-rate schedule), its checkpoints load unsharded and resume
exactly; the plain Trainer stays loud."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build

from shardcore import ShardConfig
from shardcore.testing import assert_trained_close, run_on_ranks

CFG = {"kv": 2, "vocab": 128}
STEPS = 4


class _Tokens(torch.utils.data.Dataset):
    """16 sequences of 12 token ids (no padding), labels = ids."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(1, 128, (16, 12), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _args(out: str, batch: int, **extra):
    import transformers

    settings = {
        "output_dir": out,
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": 2,
        "max_steps": STEPS,
        "learning_rate": 5e-3,
        "lr_scheduler_type": "linear",
        "warmup_steps": 1,
        "max_grad_norm": 0.5,  # the gradient norm is ~1-3 here: every step clips
        "logging_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "seed": 0,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "include_num_input_tokens_seen": "all",  # gathered: each replica's tokens counted once
        "per_device_eval_batch_size": 2,
        "save_strategy": "no",
    }
    return transformers.TrainingArguments(**(settings | extra))


def _losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _reference(out: str, batch: int) -> dict:
    """One process, the unsharded model, the plain transformers.Trainer."""
    import transformers

    torch.manual_seed(0)
    model = build("LlamaForCausalLM", **CFG)
    initial = _weights(model)
    trainer = transformers.Trainer(model=model, args=_args(out, batch), train_dataset=_Tokens())
    trainer.train()
    return {
        "losses": _losses(trainer),
        "tokens": trainer.state.num_input_tokens_seen,
        "state": _weights(model),
        "initial": initial,  # the update's own size scales the weights' tolerance
    }


def _weights(model) -> dict:
    """A copy of an unsharded model's state, by name (before and after training)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _full_state(model) -> dict:
    import shardcore

    return {name: t.clone() for name, t in shardcore.full_named_tensors(model)}


def _sharded(config: dict, out: str, batch: int, ref: dict | None, resume: bool = False, **extra) -> dict:
    import shardcore
    from shardcore.hf import Trainer

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", **CFG), ShardConfig(**config))
    trainer = Trainer(model=model, args=_args(out, batch, **extra), train_dataset=_Tokens())
    trainer.train(resume_from_checkpoint=f"{out}/checkpoint-2" if resume else None)
    report = {"losses": _losses(trainer), "tokens": trainer.state.num_input_tokens_seen}
    if ref is not None:
        what = "after Trainer.train()"
        report["max_abs_diff_weights"] = assert_trained_close(_full_state(model), ref["state"], ref["initial"], what)
    return report


def _compare(ref: dict, reports: list[dict], label: str) -> None:
    print(
        f"\n{label}: losses {[round(x, 5) for x in reports[0]['losses']]} (one process {[round(x, 5) for x in ref['losses']]})"
    )
    for r in reports:
        assert len(r["losses"]) == len(ref["losses"]) == STEPS
        for got, want in zip(r["losses"], ref["losses"], strict=True):
            assert abs(got - want) <= 1e-5 * max(abs(want), 1.0), (r["losses"], ref["losses"])
        assert "max_abs_diff_weights" in r, r  # compared on each rank (assert_trained_close)
        assert r["tokens"] == ref["tokens"], (r["tokens"], ref["tokens"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-process run per global batch size (per-device batch x data-parallel degree)."""
    out = {}
    for global_batch in (2, 4):
        out[global_batch] = run_on_ranks(1, _reference, str(tmp_path_factory.mktemp("ref")), global_batch)[0]
    return out


@pytest.mark.parametrize(
    ("config", "per_device"),
    [
        ({"tensor_parallel_size": 2}, 2),
        ({"tensor_parallel_size": 4}, 2),  # the KV heads replicated
        ({"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "ddp"}, 1),
        ({"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"}, 1),
    ],
    ids=["tp2", "tp4", "ddp2xtp2", "fsdp2xtp2"],
)
def test_trains_like_one_process_trainer(config, per_device, reference, tmp_path):
    dp = config.get("data_parallel_size", 1)
    world = dp * config["tensor_parallel_size"]
    ref = reference[per_device * dp]
    _compare(ref, run_on_ranks(world, _sharded, config, str(tmp_path), per_device, ref), str(config))


class _GradNorms:
    """A Trainer callback: the whole model's gradient norm before each optimizer step (for a sharded
    model, torch's get_total_norm over its slices: the unsharded norm)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def __getattr__(self, name):  # every other event of the callback protocol: nothing
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self.norms.append(torch.nn.utils.get_total_norm(grads).item())


def _unclipped(config: dict | None, out: str) -> dict:
    """No clipping, plain SGD (AdamW's update barely moves when a gradient is scaled: it would hide
    one twice too large): each step's gradient norm and the weights after 4 steps."""
    import transformers

    import shardcore
    from shardcore.hf import Trainer

    torch.manual_seed(0)
    model = build("LlamaForCausalLM", **CFG)
    initial = _weights(model)
    if config is not None:
        model = shardcore.optimize(model, ShardConfig(**config))
    norms = _GradNorms()
    cls = transformers.Trainer if config is None else Trainer
    args = _args(out, 2, max_grad_norm=0.0, optim="sgd", learning_rate=0.5)
    cls(model=model, args=args, train_dataset=_Tokens(), callbacks=[norms]).train()
    state = _full_state(model) if config else dict(model.state_dict())
    return {"norms": norms.norms, "state": state, "initial": initial}


def test_without_clipping_each_gradient_and_the_weights_match_one_process(tmp_path):
    """The clipped runs above would pass a gradient twice too large (clipping rescales it); here
    nothing rescales: every step's gradient norm and the SGD weights equal the one-process run's."""
    ref = run_on_ranks(1, _unclipped, None, str(tmp_path / "ref"))[0]
    for got in run_on_ranks(2, _unclipped, {"tensor_parallel_size": 2}, str(tmp_path / "tp2")):
        assert len(got["norms"]) == len(ref["norms"]) == STEPS
        for step, (a, b) in enumerate(zip(got["norms"], ref["norms"], strict=True)):
            assert abs(a - b) <= 1e-5 * b, f"step {step}: gradient norm {a} at TP=2, {b} in one process"
        assert_trained_close(got["state"], ref["state"], ref["initial"], f"after {STEPS} unclipped SGD steps")


def _evaluate(config: dict | None, out: str) -> dict:
    """evaluate() and predict() on 6 sequences, 2 per device: with dp=2 the last batch is a
    remainder (accelerate pads it with repeated samples and drops them again after gathering)."""
    import transformers

    import shardcore
    from shardcore.hf import Trainer

    torch.manual_seed(0)
    model = build("LlamaForCausalLM", **CFG)
    data = torch.utils.data.Subset(_Tokens(), range(6))
    if config is None:
        trainer = transformers.Trainer(model=model, args=_args(out, 2), eval_dataset=data)
    else:
        trainer = Trainer(model=shardcore.optimize(model, ShardConfig(**config)), args=_args(out, 2), eval_dataset=data)
    metrics = trainer.evaluate()
    pred = trainer.predict(data)
    return {"eval_loss": metrics["eval_loss"], "logits": torch.as_tensor(pred.predictions), "labels": pred.label_ids}


@pytest.mark.parametrize(
    "config",
    [{"tensor_parallel_size": 2}, {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "ddp"}],
    ids=["tp2", "ddp2xtp2"],
)
def test_evaluate_and_predict_like_one_process(config, tmp_path):
    # gathered over every process, each prediction would come back once per tensor-parallel rank
    (ref,) = run_on_ranks(1, _evaluate, None, str(tmp_path / "ref"))
    world = config["tensor_parallel_size"] * config.get("data_parallel_size", 1)
    for r in run_on_ranks(world, _evaluate, config, str(tmp_path / "sharded")):
        assert abs(r["eval_loss"] - ref["eval_loss"]) <= 1e-6 * ref["eval_loss"], (r["eval_loss"], ref["eval_loss"])
        assert r["logits"].shape == ref["logits"].shape == (6, 12, 128), r["logits"].shape
        assert (r["logits"] - ref["logits"]).abs().max() <= 1e-5
        assert (r["labels"] == ref["labels"]).all()


DDP2XTP2 = {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "ddp"}


def _save_steps(out: str, ref: dict) -> dict:
    return _sharded(DDP2XTP2, out, 1, ref, save_strategy="steps", save_steps=2)


def _resume(out: str, ref: dict) -> dict:
    return _sharded(DDP2XTP2, out, 1, ref, resume=True, save_strategy="steps", save_steps=2)


def test_checkpoints_load_unsharded_and_resume_exactly(reference, tmp_path):
    import os

    import transformers

    ref, out = reference[2], str(tmp_path)
    _compare(ref, run_on_ranks(4, _save_steps, out, ref), "saving every 2 steps")
    assert sorted(os.listdir(tmp_path / "checkpoint-2")) == sorted(
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "scheduler.pt",
            "shardcore_checkpoint.json",  # save_checkpoint's record of a complete save
            "shardcore_complete.json",  # the Trainer checkpoint's record, written last
            "trainer_state.json",
            "training_args.bin",
            *(f"optimizer.rank{r}-of-4.pt" for r in range(4)),
            *(f"rng_state_{r}.pth" for r in range(4)),
        ]
    )
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / f"checkpoint-{STEPS}")  # unsharded
    got = {n: loaded.state_dict()[n] for n in ref["state"]}
    assert_trained_close(got, ref["state"], ref["initial"], f"loaded from checkpoint-{STEPS} unsharded")
    # a new run resumes at step 2: steps 3 and 4 give the uninterrupted run's losses and weights
    _compare(ref, run_on_ranks(4, _resume, out, ref), "resumed from checkpoint-2")


def _plain_trainer(out: str) -> str:
    import transformers

    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", **CFG), ShardConfig(tensor_parallel_size=2))
    trainer = transformers.Trainer(model=model, args=_args(out, 2), train_dataset=_Tokens())
    try:
        trainer.train()
    except shardcore.InputMismatch as err:
        return str(err)
    return "trained"


def test_plain_trainer_stays_loud(tmp_path):
    # transformers.Trainer shards the batches over every process: the TP ranks get different data
    for message in run_on_ranks(2, _plain_trainer, str(tmp_path)):
        assert "differs" in message, message


def _refused(config: dict, extra: dict) -> str:
    import shardcore
    from shardcore.hf import Trainer

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", **CFG, layers=2), ShardConfig(**config))
    try:
        Trainer(model=model, args=_args("/tmp/unused", 1, **extra), train_dataset=_Tokens())
    except (NotImplementedError, ValueError) as err:
        return str(err)
    return "accepted"


@pytest.mark.parametrize(
    ("config", "extra", "expected"),
    [
        ({"pipeline_parallel_size": 2}, {}, "pipeline stages (pipeline_parallel_size > 1) is not supported"),
        ({"tensor_parallel_size": 2, "data_parallel_size": 2}, {}, "set ShardConfig(data_parallel='ddp') or 'fsdp'"),
        ({"tensor_parallel_size": 2}, {"eval_use_gather_object": True}, "eval_use_gather_object=True gathers"),
    ],
    ids=["pipeline", "dp-without-data-parallel", "eval-gather-object"],
)
def test_refused_by_name(config, extra, expected):
    for message in run_on_ranks(4 if "data_parallel_size" in config else 2, _refused, config, extra):
        assert expected in message, message


def _accelerate_loop(prepare_data: bool) -> dict:
    """A custom accelerate loop: ``accelerator.prepare(model, optimizer[, dataloader])``."""
    import accelerate

    import shardcore

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", **CFG)
    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", **CFG), ShardConfig(tensor_parallel_size=2))
    initial = _weights(ref)
    # a fresh accelerate state: these workers ran Trainers before (accumulation steps, sync flags)
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=False)
    accelerate.state.GradientState._reset_state()
    accelerator = accelerate.Accelerator(cpu=True)
    opt, opt_ref = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_Tokens(), batch_size=4)
    if prepare_data:
        model, opt, loader = accelerator.prepare(model, opt, loader)
    else:  # the same batches on every rank: DDP over the world must leave the slices alone
        model, opt = accelerator.prepare(model, opt)
    try:
        for batch in list(loader)[:2]:
            for m, o in ((model, opt), (ref, opt_ref)):
                loss = m(**batch).loss
                accelerator.backward(loss) if m is model else loss.backward()
                accelerator.clip_grad_norm_(m.parameters(), 0.5) if m is model else torch.nn.utils.clip_grad_norm_(
                    m.parameters(), 0.5
                )
                o.step()
                o.zero_grad()
    except shardcore.InputMismatch as err:
        return {"error": str(err)}
    full = _full_state(accelerator.unwrap_model(model))
    return {"max_abs_diff_weights": assert_trained_close(full, ref.state_dict(), initial, "after accelerate's loop")}


def test_accelerate_prepare_is_right_or_loud():
    for report in run_on_ranks(2, _accelerate_loop, False):
        assert "max_abs_diff_weights" in report, report  # compared on each rank (assert_trained_close)
    for report in run_on_ranks(2, _accelerate_loop, True):  # the TP ranks got different batches
        assert "differs" in report.get("error", ""), report
