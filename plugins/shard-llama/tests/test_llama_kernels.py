"""shard-llama with the optimization switches, and ``shardcore explain`` against real steps."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore import kernels as _kernels
from shardcore.integrations.hf.attention import hf_sdpa_name
from shardcore.testing import (
    SWITCHES,
    assert_explain_matches,
    assert_outputs_close,
    assert_switch_matches,
    run_on_ranks,
)


def _explain(tp: int, kv: int, layers: int) -> dict:
    return assert_explain_matches(
        lambda: build("LlamaForCausalLM", kv=kv, layers=layers), lm_batch(), ShardConfig(tensor_parallel_size=tp)
    )


@pytest.mark.parametrize(("tp", "kv", "layers"), [(2, 2, 1), (2, 4, 3), (4, 2, 2)], ids=["gqa", "mha", "replicated-kv"])
def test_explain_predicts_a_step(tp, kv, layers):
    """explain (meta device, no process group) predicts the collectives of a real forward and
    backward, by kind, and the bytes rank 0 holds; replicated KV heads add their gradient sums."""
    reports = run_on_ranks(tp, _explain, tp, kv, layers)
    per_layer = reports[0]["collectives_per_layer"]["LlamaDecoderLayer"]
    assert per_layer["forward"] == {"all_reduce": 2}
    assert per_layer["backward"]["all_reduce"] == (2 if tp <= kv else 2 + 2)
    # the bytes each rank put into its collectives were predicted too (the kit compared them)
    assert reports[0]["collective_bytes_per_step"]["forward"]["all_reduce"] > 0, reports[0]["notes"]


LLAMA_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


_MEASURED_CLI = (
    "import resource, sys\n"
    "from shardcore.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _cli(*args: str) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run the ``shardcore`` command line in a fresh interpreter: result, seconds, its own peak RSS in bytes."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _MEASURED_CLI, *args], capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    peak = int(proc.stderr.rsplit("peak_rss_kb", 1)[1].split()[0]) * 1024 if "peak_rss_kb" in proc.stderr else -1
    return proc, seconds, peak


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """The ``shardcore`` command line in this process (where nothing of the process is measured):
    exit code, stdout, stderr."""
    from shardcore.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def llama_7b(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-7b")
    (path / "config.json").write_text(json.dumps(LLAMA_7B))
    return path


def test_explain_7b_at_tp4(llama_7b):
    """A Llama-2-7B-shaped config at TP=4: seconds and well under 1 GB (the meta device: nothing
    allocated), each rank a quarter of the model within 1%."""
    proc, seconds, peak = _cli("explain", str(llama_7b), "--tp", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    hidden, inter, layers, vocab, kv_dim = 4096, 11008, 32, 32000, 1024
    full = 4 * (
        layers * (2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * inter + 2 * hidden)
        + 2 * vocab * hidden
        + hidden
    )
    assert report["bytes_unsharded"] == full
    from shardcore.explain.report import format_report

    text = format_report(report)  # the text form: binary units, counted by hand
    assert f"parameters: {full / 2**30:.1f} GB unsharded" in text, f"explain's text says {text.splitlines()[1]!r}"
    assert abs(report["bytes_per_rank"] / (full / 4) - 1) < 0.01, report["fraction_per_rank"]
    assert report["collectives_per_layer"]["LlamaDecoderLayer"]["forward"] == {"all_reduce": 2}
    assert peak < 1024**3, f"peak RSS {peak / 2**20:.0f} MB"
    print(f"explain 7B at TP=4: {seconds:.1f} s, peak RSS {peak / 2**20:.0f} MB")


def test_explain_refuses_tp3(llama_7b, capsys):
    """An impossible layout: non-zero exit, optimize's message naming the field and the valid sizes, no
    traceback (in this process an uncaught exception would fail the test itself)."""
    code, out, err = _main(capsys, "explain", str(llama_7b), "--tp", "3")
    assert code == 1
    assert "num_attention_heads=32 is not divisible by tensor_parallel_size=3" in err, err
    assert "[1, 2, 4, 8, 16, 32]" in err
    assert "Traceback" not in err
    assert out == ""


def test_explain_table_and_bad_spec(llama_7b, capsys):
    code, out, err = _main(capsys, "explain", str(llama_7b), "--tp", "2", "--pp", "2")
    assert code == 0, err
    assert "model.layers.*.self_attn.q_proj" in out and "Linear1D_Col" in out
    assert "pipeline stages (per rank)" in out
    assert "Policy.blocks() split evenly as optimize cuts them" in out
    code, out, err = _main(capsys, "explain", "no_such_module:Model", "--tp", "2")
    assert code == 1 and "cannot import 'no_such_module:Model'" in err, err
    assert "Traceback" not in err


def test_explain_ring_against_all_gather_kv(llama_7b, capsys):
    """explain --sp 4 --seq 8192: the ring keeps a block of keys and values per layer, the gathered
    variant the whole sequence's (sp times more); shifts counted per layer."""
    import transformers

    from shardcore.explain import explain

    args = ("explain", str(llama_7b), "--tp", "1", "--sp", "4", "--sp-mode", "ring_attn", "--seq", "8192")
    code, out, err = _main(capsys, *args)
    if int(transformers.__version__.split(".")[0]) < 5:  # no attention and mask registries to run the ring
        assert code == 1 and "runs attention through transformers' attention and mask registries" in err, err
        pytest.skip("transformers 4.x: refused by name (checked); the ring's report needs transformers 5")
    assert code == 0, err
    assert "attention keys/values per rank (ring_attn, 8192 tokens x 1): kept for the backward 16.0 MB" in out
    kept, sent = {}, {}
    for mode in ("ring_attn", "all_gather_kv"):  # in this process: the same report as the command's --json
        config = ShardConfig(enable_sequence_parallelism=True, sequence_parallelism_mode=mode)
        report = explain(str(llama_7b), 1, sp=4, config=config, seq=8192)
        kept[mode] = report["sequence"]["kv_bytes_kept_per_layer"]
        sent[mode] = report["sequence"]["bytes_sent_per_layer"]
        per_layer = report["collectives_per_layer"]["LlamaDecoderLayer"]
    block = 8 * 2048 * 128 * 4  # one rank's keys: 8 kv heads x 8192 / 4 tokens x 128 x float32
    assert kept == {"ring_attn": 2 * block, "all_gather_kv": 2 * 4 * block}, kept
    assert sent["ring_attn"] == {"forward": 3 * 2 * block, "backward": 4 * 4 * block}, sent
    assert per_layer["forward"] == {"all_gather": 2} and per_layer["backward"]["reduce_scatter"] == 2, per_layer


def _flag(tp: int, flag: str, kv: int) -> dict:
    # that the kernels equal the model's own eager path: test_kernels_match_eager
    return assert_switch_matches(lambda: build("LlamaForCausalLM", kv=kv), lm_batch(), flag, tp)


@pytest.mark.parametrize("flag", list(SWITCHES))
def test_optimization_flags_at_tp2(flag):
    """Each switch at TP=2 with grouped-query attention: outputs, loss, every gradient and three
    AdamW steps equal to the unsharded model running the same kernels."""
    (kernels, _) = run_on_ranks(2, _flag, 2, flag, 2)
    if flag in ("flash", "all"):
        assert kernels["attention"] == hf_sdpa_name()  # "sdpa" under transformers 4.x
    if flag in ("norm", "all"):
        assert kernels["normalization"] == "5 norms on fused kernels"  # 2 layers x 2 + final
    if flag in ("jit", "all"):
        assert kernels["jit_fused"] == "2 modules compiled (LlamaMLP)"


def test_flash_attention_at_tp4_with_replicated_kv():
    """4 ranks, 2 KV heads (each replicated on 2 ranks) on the registry's SDPA with grouped K/V."""
    (kernels, *_) = run_on_ranks(4, _flag, 4, "flash", 2)
    assert kernels["attention"] == hf_sdpa_name()


def _eager_build():
    model = build("LlamaForCausalLM", kv=2)
    model.config._attn_implementation = "eager"
    return model


def test_kernels_match_eager():
    """All switches, unsharded, against the model's own eager attention and unfused norms and MLP:
    logits of every real (unpadded) token, the loss and every gradient, within fp32 rounding
    (SDPA and the fused kernels sum in another order; padded query rows are excluded: eager and SDPA
    fill a row with no visible key differently)."""
    import shardcore

    torch.manual_seed(0)
    ref = _eager_build()
    torch.manual_seed(0)
    model = shardcore.optimize(_eager_build(), ShardConfig(tensor_parallel_size=1, enable_all_optimization=True))
    assert model.config._attn_implementation == hf_sdpa_name()
    batch = lm_batch()  # padded: the masked grouped-K/V path
    real = batch["attention_mask"].bool()
    assert_outputs_close(model(**batch).logits[real], ref(**batch).logits[real], "SDPA logits against eager")
    # the loss of a left-padded row reads the last pad position's prediction (of the first real
    # token), one of the rows eager and SDPA fill differently: loss and gradients on unpadded rows
    batch = lm_batch(pad=False)
    out, expected = model(**batch), ref(**batch)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    out.loss.backward()
    expected.loss.backward()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g, e = p.grad, ref_params[name].grad
        assert (g - e).norm() <= 1e-5 * e.norm() + 1e-7, name


def _inference_only(tp: int) -> dict:
    import shardcore

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", kv=2).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(
        build("LlamaForCausalLM", kv=2), ShardConfig(tensor_parallel_size=tp, inference_only=True)
    )
    torch.manual_seed(0)
    trained = shardcore.optimize(build("LlamaForCausalLM", kv=2), ShardConfig(tensor_parallel_size=tp))
    batch = lm_batch()
    assert_outputs_close(model(**batch).logits, ref(**batch).logits, "inference-only logits")
    attn, attn_trained = model.model.layers[0].self_attn, trained.model.layers[0].self_attn
    return {
        "hooks": (len(attn._forward_pre_hooks), len(attn_trained._forward_pre_hooks)),
        "rng_wrapped": ("forward" in vars(attn), "forward" in vars(attn_trained)),
        "frozen": not any(p.requires_grad for p in model.parameters()),
        "generate": model.generate(batch["input_ids"][1:], max_new_tokens=4, do_sample=False).tolist(),
        "generate_ref": ref.generate(batch["input_ids"][1:], max_new_tokens=4, do_sample=False).tolist(),
    }


def test_inference_only():
    """inference_only at TP=2: same logits and greedy tokens; the attention has no entry hook
    (backward all-reduce) and no per-rank random stream, which the training layout has."""
    for result in run_on_ranks(2, _inference_only, 2):
        assert result["hooks"] == (1, 2)  # only the hook naming the module for timeouts is left
        assert result["rng_wrapped"] == (False, True)
        assert result["frozen"]
        assert result["generate"] == result["generate_ref"]


def _flash_cuda() -> None:
    import shardcore

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", kv=2).cuda().to(torch.bfloat16)
    torch.manual_seed(0)
    model = build("LlamaForCausalLM", kv=2).cuda().to(torch.bfloat16)
    model = shardcore.optimize(model, ShardConfig(tensor_parallel_size=1, enable_flash_attention=True))
    assert model.config._attn_implementation == "flash_attention_2"
    batch = {k: v.cuda() for k, v in lm_batch().items()}
    real = batch["attention_mask"].bool()
    # bf16: flash-attn and SDPA round differently; a bf16 tolerance
    torch.testing.assert_close(model(**batch).logits[real], ref(**batch).logits[real], rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and _kernels.flash_attn_available()),
    reason="flash-attn path: needs CUDA and flash-attn 2 (pip install shardcore[flash]); this machine has neither",
)
def test_flash_attn_on_cuda():
    _flash_cuda()
