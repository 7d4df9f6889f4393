"""The optimization switches' core: backend dispatch, fused norms, the JIT fallback, inference_only."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from toy_models import ToyLM, ToyPolicy, toy_batch

import shardcore
from shardcore import ShardConfig, kernels
from shardcore.plugin_api import KernelSpec
from shardcore.tensor_parallel import FusedLayerNorm, FusedRMSNorm
from shardcore.testing import assert_outputs_close, run_on_ranks


@pytest.mark.parametrize(
    ("device", "dtype", "flash", "expected"),
    [
        ("cuda", torch.float16, True, "flash_attention_2"),
        ("cuda", torch.bfloat16, True, "flash_attention_2"),
        ("cuda", torch.float32, True, "sdpa"),  # flash-attn computes in half precision only
        ("cuda", torch.float16, False, "sdpa"),  # not installed
        ("cpu", torch.bfloat16, True, "sdpa"),  # flash-attn is CUDA only
        ("cpu", torch.float32, False, "sdpa"),
    ],
)
def test_attention_backend_dispatch(device, dtype, flash, expected):
    assert kernels.attention_backend(device, dtype, flash=flash) == expected


def test_flash_probe_matches_installation():
    import importlib.util

    installed = importlib.util.find_spec("flash_attn") is not None
    assert kernels.flash_attn_available() == installed
    if not installed:  # this machine: enable_flash_attention means SDPA, whatever the dtype
        assert kernels.attention_backend("cpu", torch.bfloat16) == "sdpa"


class _HFStyleRMSNorm(nn.Module):
    """The formula HuggingFace's Llama/Mistral/Qwen2 RMSNorms compute."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rms_norm_matches_and_keeps_the_parameter(dtype):
    torch.manual_seed(0)
    native = _HFStyleRMSNorm(64).to(dtype)
    fused = FusedRMSNorm.from_native_module(native)
    assert fused.weight is native.weight and fused.eps == 1e-6
    x = torch.randn(3, 5, 64, dtype=dtype, requires_grad=True)
    expected, got = native(x), fused(x)
    # fp32: the fused kernel sums in another order (a few ulps); bf16: same fp32 math, then the same cast
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(got, expected, **tol)
    (g_expected,) = torch.autograd.grad(expected.float().square().sum(), x)
    (g_got,) = torch.autograd.grad(got.float().square().sum(), x)
    torch.testing.assert_close(g_got, g_expected, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-2)


def test_fused_rms_norm_refuses_what_it_cannot_compute():
    with pytest.raises(TypeError, match="has no eps"):
        FusedRMSNorm.from_native_module(nn.Linear(4, 4))


def test_fused_layer_norm_is_the_same_layer_norm():
    torch.manual_seed(0)
    native = nn.LayerNorm(64)
    nn.init.normal_(native.weight)
    fused = FusedLayerNorm.from_native_module(native)
    assert isinstance(fused, nn.LayerNorm) and fused.weight is native.weight and fused.bias is native.bias
    assert fused.state_dict().keys() == native.state_dict().keys()
    x = torch.randn(2, 7, 64)
    torch.testing.assert_close(fused(x), native(x), rtol=0, atol=0)  # one kernel on the CPU either way


def test_replace_norms_covers_layer_norms_and_the_policy_classes():
    class LibraryLayerNorm(nn.LayerNorm):
        pass

    model = nn.Sequential(
        nn.LayerNorm(8), _HFStyleRMSNorm(8), nn.RMSNorm(8), LibraryLayerNorm(8), LibraryLayerNorm(8), nn.Linear(8, 8)
    )
    assert kernels.replace_norms(model, (_HFStyleRMSNorm,)) == 3  # a LayerNorm subclass only when named
    assert type(model[3]) is LibraryLayerNorm
    assert kernels.replace_norms(model, (LibraryLayerNorm,)) == 2
    kinds = ["FusedLayerNorm", "FusedRMSNorm", "FusedRMSNorm", "FusedLayerNorm", "FusedLayerNorm", "Linear"]
    assert [type(m).__name__ for m in model] == kinds
    x = torch.randn(4, 8)
    model(x)  # nn.RMSNorm's eps=None: torch's default, accepted


class _MLPPolicy(ToyPolicy):
    def kernels(self):
        return KernelSpec(fusible=[(f"blocks.{i}", b) for i, b in enumerate(self.model.blocks)])


def test_jit_fallback_warns_once_and_runs_eager(monkeypatch, caplog):
    """Where torch.compile cannot work, enable_jit_fused says so once at WARNING and the model runs as before."""

    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    kernels.compile_available.cache_clear()
    kernels._announced.discard("jit")
    monkeypatch.setattr(torch, "compile", broken_compile)
    try:
        torch.manual_seed(0)
        ref = ToyLM()
        torch.manual_seed(0)
        with caplog.at_level(logging.WARNING, logger="shardcore"):
            model = shardcore.optimize(
                ToyLM(), ShardConfig(tensor_parallel_size=1, enable_jit_fused=True), policy=_MLPPolicy
            )
            shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=1, enable_jit_fused=True), policy=_MLPPolicy)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "torch.compile is unavailable here (RuntimeError: no C++ compiler found)" in warnings[0].getMessage()
        assert all("forward" not in vars(b) for b in model.blocks)  # nothing was compiled
        batch = toy_batch()
        torch.testing.assert_close(model(**batch)["logits"], ref(**batch)["logits"], rtol=0, atol=0)
    finally:
        kernels.compile_available.cache_clear()


def _inference_only(tp: int) -> dict:
    torch.manual_seed(0)
    ref = ToyLM().eval()
    torch.manual_seed(0)
    model = shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=tp, inference_only=True), policy=ToyPolicy)
    batch = toy_batch()
    out, expected = model(**batch), ref(**batch)
    assert_outputs_close(out["logits"], expected["logits"], "inference-only logits")
    frozen = not any(p.requires_grad for p in model.parameters())
    assert not out["logits"].requires_grad  # no autograd graph kept, even outside torch.no_grad()
    model.train()
    try:
        model(**batch)
    except RuntimeError as err:
        refused = str(err)
    else:
        refused = ""
    return {"frozen": frozen, "eval": not ref.training, "refused": refused}


def test_inference_only_at_tp2():
    """inference_only: the unsharded outputs, frozen parameters, and training refused clearly on every rank."""
    for result in run_on_ranks(2, _inference_only, 2):
        assert result["frozen"]
        assert "inference_only=True" in result["refused"] and "model.eval()" in result["refused"]


def test_switches_are_plain_booleans():
    with pytest.raises(TypeError):
        ShardConfig(enable_flash_attention="yes")
    config = ShardConfig(enable_all_optimization=True)
    assert kernels._switches(config) == (True, True, True)
    assert kernels._switches(ShardConfig(enable_jit_fused=True)) == (False, False, True)
