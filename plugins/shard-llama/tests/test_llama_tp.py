"""Sharded Llama / Mistral / Qwen2 against the unsharded model, on real gloo ranks."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, gather_vocab_logits, lm_batch

from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import (
    assert_generate_matches,
    assert_outputs_close,
    assert_sharded_matches,
    hidden_state_loss,
    run_on_ranks,
)


def _check(tp: int, cls_name: str, family: str = "llama", parallel_output: bool = False, **cfg) -> dict:
    vocab = cfg.get("vocab", 128)
    batch = lm_batch(vocab)
    if cls_name.endswith("Model"):
        batch.pop("labels")
    if cls_name.endswith("SequenceClassification"):
        batch["labels"] = torch.tensor([1, 0])
    kwargs = {}
    if cls_name.endswith("Model"):
        kwargs["loss_fn"] = hidden_state_loss("last_hidden_state")
    if parallel_output:
        kwargs["sharded_output_fn"] = gather_vocab_logits
    return assert_sharded_matches(
        lambda: build(cls_name, family, **cfg),
        batch,
        ShardConfig(tensor_parallel_size=tp, parallel_output=parallel_output),
        # everything but the norms (and the small score head) is split: about 1/tp of the bytes
        max_param_fraction=1 / tp + 0.1,
        **kwargs,
    )


@pytest.mark.parametrize("tp", [2, 4])  # TP=1 returns the model itself: tested once, in the core
def test_causal_lm(tp):
    run_on_ranks(tp, _check, tp, "LlamaForCausalLM")


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize(
    "case",
    [
        {"kv": 2},  # GQA: split at TP=2, replicated KV heads at TP=4
        {"tie": True},  # tied input/output embeddings
        {"vocab": 1001},  # vocab not divisible by TP: padded, invisible
        {"kv": 2, "tie": True, "vocab": 1001},
        {"heads": 8, "kv": 1},  # multi-query attention: one KV head on every rank
    ],
    ids=["gqa", "tied", "vocab1001", "all", "mqa"],
)
def test_causal_lm_variants(tp, case):
    run_on_ranks(tp, _check, tp, "LlamaForCausalLM", **case)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize(
    "vocab", [1001, 128], ids=["vocab1001", "vocab128"]
)  # 128 at TP=4: ranks 2, 3 hold only padding
def test_parallel_output_vocab_parallel_loss(tp, vocab):
    run_on_ranks(tp, _check, tp, "LlamaForCausalLM", parallel_output=True, vocab=vocab, kv=2, tie=True)


@pytest.mark.parametrize("tp", [2, 4])  # TP=1 returns the model itself: tested once, in the core
@pytest.mark.parametrize("cls_name", ["LlamaModel", "LlamaForSequenceClassification"])
def test_other_heads(tp, cls_name):
    run_on_ranks(tp, _check, tp, cls_name, kv=2)


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
@pytest.mark.parametrize("cls_suffix", ["ForCausalLM", "ForSequenceClassification", "Model"])
def test_same_architecture_families(family, cls_suffix):
    prefix = {"mistral": "Mistral", "qwen2": "Qwen2"}[family]
    run_on_ranks(2, _check, 2, prefix + cls_suffix, family, kv=2)


def _count(tp: int, layers: int, parallel_output: bool = False) -> dict:
    import shardcore

    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=tp, parallel_output=parallel_output)
    model = shardcore.optimize(build("LlamaForCausalLM", layers=layers), config)
    batch = lm_batch()
    with count_collectives() as fwd:
        out = model(**batch)
    with count_collectives() as bwd:
        out.loss.backward()
    return {"forward": dict(fwd), "backward": dict(bwd)}


@pytest.mark.parametrize("parallel_output", [False, True])
@pytest.mark.parametrize("layers", [1, 3])
def test_collectives_per_step(layers, parallel_output):
    """Forward: one all-reduce after attention and one after the MLP per layer, one for the
    embedding, one all-gather of the loss's per-token statistics (the loss is computed on the
    vocabulary slices) and, unless parallel_output, one of the logits. Backward: one all-reduce
    per entry into a tensor-parallel region."""
    for counts in run_on_ranks(2, _count, 2, layers, parallel_output):  # on every rank
        # + one all-gather of 16 bytes: the input check (ShardConfig.check_inputs, on by default)
        gathers = 2 if parallel_output else 3
        assert counts["forward"] == {"all_reduce": 2 * layers + 1, "all_gather": gathers}
        assert counts["backward"] == {"all_reduce": 2 * layers + 1}, f"backward collectives {counts['backward']}"


def _generate(tp: int, kv: int, num_beams: int) -> list:
    import shardcore

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", kv=kv, vocab=1001, initializer_range=0.1).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(
        build("LlamaForCausalLM", kv=kv, vocab=1001, initializer_range=0.1).eval(),
        ShardConfig(tensor_parallel_size=tp),
    )
    batch = lm_batch(1001, seed=3)
    args = {"max_new_tokens": 16, "do_sample": False, "num_beams": num_beams, "use_cache": True, "pad_token_id": 0}
    tokens = assert_generate_matches(
        ref, model, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **args
    )
    assert tokens.shape == (2, 12 + 16), tokens.shape
    return tokens.tolist()


@pytest.mark.parametrize(
    ("tp", "kv", "num_beams"),
    [(2, 4, 1), (2, 2, 1), (2, 2, 4), (4, 2, 1), (4, 2, 4)],
    ids=["mha-greedy", "gqa-greedy", "gqa-beam4", "replicated-kv-greedy", "replicated-kv-beam4"],
)
def test_generate_kv_cache(tp, kv, num_beams):
    """Greedy and beam search with the KV cache, split and replicated (TP=4, 2 KV heads) KV heads:
    the unsharded tokens and per-step scores, on inputs whose tokens vary."""
    tokens = run_on_ranks(tp, _generate, tp, kv, num_beams)
    assert all(t == tokens[0] for t in tokens)


def _subclass(tp: int) -> str:
    import transformers

    import shardcore

    class MyLlama(transformers.LlamaForCausalLM):
        pass

    torch.manual_seed(0)
    model = shardcore.optimize(MyLlama(build("LlamaForCausalLM").config), ShardConfig(tensor_parallel_size=tp))
    return type(model.shardcore.policy).__name__ + ":" + type(model.lm_head).__name__


def test_user_subclass_matched_through_mro():
    assert run_on_ranks(2, _subclass, 2) == ["LlamaForCausalLMPolicy:VocabParallelLMHead1D"] * 2


def _parallel_output_generate_refused() -> str:
    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM"), ShardConfig(tensor_parallel_size=2, parallel_output=True))
    with pytest.raises(RuntimeError, match="parallel_output=False"):
        model.generate(input_ids=torch.ones(1, 3, dtype=torch.long), max_new_tokens=2)
    return "ok"


def test_parallel_output_refuses_generate():
    assert run_on_ranks(2, _parallel_output_generate_refused) == ["ok", "ok"]


def _loss_on_slices(tp: int) -> dict:
    import shardcore

    torch.manual_seed(0)
    reference = build("LlamaForCausalLM", vocab=200)  # 200 = padded to 256: the last rank holds padding
    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", vocab=200), ShardConfig(tensor_parallel_size=tp))
    batch = lm_batch(200)
    checks = {}
    # HF Trainer's num_items_in_batch, and shift_labels given instead of labels
    items = torch.tensor(9)
    shifted = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
    for name, extra in {
        "num_items_in_batch": {"num_items_in_batch": items},
        "shift_labels": {"labels": None, "shift_labels": shifted},
    }.items():
        kwargs = {**batch, **extra}
        want, got = reference(**kwargs), model(**kwargs)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        assert_outputs_close(got.logits, want.logits, f"logits with {name}")
        checks[name] = got.logits.shape[-1]
    # return_dict=False: the tuple holds the gathered logits where the slice was
    want, got = reference(**batch, return_dict=False), model(**batch, return_dict=False)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert_outputs_close(got[1], want[1], "logits with return_dict=False")
    # a forward that raises after the head ran leaves the head as it was: full logits when called alone
    try:
        model(**{**batch, "labels": batch["labels"][:, :5]})
    except Exception as err:  # labels of the wrong length: the loss raises after the head ran
        checks["raised"] = type(err).__name__
    hidden = torch.randn(2, 3, 64)
    checks["head alone"] = model.lm_head(hidden).shape[-1]
    checks["pending"] = model.lm_head.pending_logits is None
    # a full backward hook on the head hands the model other tensor objects: still the full logits
    model.lm_head.register_full_backward_hook(lambda module, grad_in, grad_out: None)
    want, got = reference(**batch), model(**batch)
    assert_outputs_close(got.logits, want.logits, "logits under a full backward hook on the head")
    got.loss.backward()
    return checks


@pytest.mark.parametrize("tp", [2, 4])
def test_default_loss_on_vocab_slices(tp):
    """The default (parallel_output=False): the loss is the vocab-parallel cross entropy of the
    slices while the logits are gathered, equal to HF's loss with num_items_in_batch or
    shift_labels, with return_dict=False, and a forward that raises leaves no gather behind."""
    for checks in run_on_ranks(tp, _loss_on_slices, tp):
        assert checks.pop("raised", None), "labels of the wrong length did not raise"
        assert checks == {"num_items_in_batch": 200, "shift_labels": 200, "head alone": 200, "pending": True}


def _diverged_replica() -> dict:
    # TP=4 with 2 KV heads: ranks 0 and 1 hold the same v_proj rows. Rank 1's copy gets another
    # gradient; gathering takes rank 0's copy, so only the kit's per-rank check can see it.
    from shard_llama.policy import LlamaForCausalLMPolicy

    class Diverging(LlamaForCausalLMPolicy):
        def postprocess(self):
            model = super().postprocess()
            if torch.distributed.get_rank() == 1:
                model.model.layers[0].self_attn.v_proj.weight.register_hook(lambda g: g * 1.01)
            return model

    # steps=0: the kit returns after the gradient checks, so the ranks that pass join no collective
    # the failing ones never reach
    return assert_sharded_matches(
        lambda: build("LlamaForCausalLM", kv=2),
        lm_batch(),
        ShardConfig(tensor_parallel_size=4),
        policy=Diverging,
        steps=0,
    )


def test_kit_sees_a_replica_that_diverged():
    from shardcore.testing import RankError

    with pytest.raises(RankError, match=r"v_proj\.weight \(this rank's slice\): relative error"):
        run_on_ranks(4, _diverged_replica)
