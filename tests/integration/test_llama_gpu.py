"""The GPU subset (``pytest -m gpu``): shardcore's paths on a real CUDA device. On a machine without
one every test here is skipped and says so; CI has none, so these run where a GPU is lent.

One GPU is enough for what they check, and all one device allows: NCCL refuses two ranks on one
device ("Duplicate GPU detected"), so the multi-rank numerics stay on the CPU gloo suite, and here
one rank runs every path a user runs on a GPU for real:

* a user's own NCCL-only process group (``init_process_group("nccl")``, no CPU backend beside it):
  the default first forward with its input check, two training steps with torch's
  ``clip_grad_norm_``, ``generate``, ``save_checkpoint`` then ``load_checkpoint``, and
  ``save_pretrained`` then ``from_pretrained``, each against the plain model on the same device;
* the group shardcore starts itself (``init_from_env``: ``cpu:gloo,cuda:nccl``);
* the kernel switches (fused norms, the compiled projection modules, SDPA) in bf16 on CUDA.
"""

from __future__ import annotations

import copy
import os
import pathlib
import socket
import subprocess
import sys
import tempfile

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="the GPU subset needs a CUDA device; this machine has none"
    ),
]


def _cuda(batch: dict) -> dict:
    return {k: v.cuda() for k, v in batch.items()}


def _train(model, batch) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    norms = []
    for _ in range(2):
        model(**batch).loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step()
        opt.zero_grad()
    return norms


def _generate(model, batch) -> list[list[int]]:
    with torch.no_grad():
        out = model.generate(
            batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=4, do_sample=False
        )
    return out.tolist()


def _close(a: torch.Tensor, b: torch.Tensor, what: str, tol: float = 1e-4) -> None:
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


def _default_paths(backend_note: str) -> dict:
    """Every user path, sharded model vs the plain one, both on ``cuda``; the group already made."""
    import torch.distributed as dist
    import transformers

    import shardcore
    from shardcore.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", kv=2).cuda()
    model = shardcore.optimize(copy.deepcopy(ref), ShardConfig(tensor_parallel_size=1))
    assert next(model.parameters()).is_cuda
    batch = _cuda(lm_batch())
    real = batch["attention_mask"].bool()
    _close(model(**batch).logits[real], ref(**batch).logits[real], "first forward (input check on)")
    norms, ref_norms = _train(model, batch), _train(ref, batch)
    assert all(abs(a - b) <= 1e-4 * b for a, b in zip(norms, ref_norms, strict=True)), (norms, ref_norms)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        _close(p, q, f"{name} after two clipped AdamW steps")
    model.eval(), ref.eval()
    assert _generate(model, batch) == _generate(ref, batch), "greedy generate differs from the plain model's"
    with tempfile.TemporaryDirectory() as path:
        save_checkpoint(model, path)
        torch.manual_seed(1)
        fresh = shardcore.optimize(build("LlamaForCausalLM", kv=2).cuda(), ShardConfig(tensor_parallel_size=1))
        load_checkpoint(fresh, path)
        for (name, p), q in zip(fresh.state_dict().items(), ref.state_dict().values(), strict=True):
            _close(p, q, f"{name} after save_checkpoint/load_checkpoint", tol=0)
    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        back = transformers.LlamaForCausalLM.from_pretrained(path).cuda().eval()
        _close(back(**batch).logits[real], ref(**batch).logits[real], "save_pretrained/from_pretrained")
    torch.cuda.synchronize()
    return {"backend": str(dist.get_backend()) if dist.is_initialized() else "none", "note": backend_note}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_in_fresh_process(how: str) -> dict:
    """Entry of the child process: make the group ``how`` says, run the paths, tear it down."""
    import torch.distributed as dist

    from shardcore.distributed import init_from_env

    if how == "user-nccl-only":
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    else:
        init_from_env()
    try:
        return _default_paths(how)
    finally:
        dist.destroy_process_group()


def _child(how: str) -> str:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    env |= {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    here = pathlib.Path(__file__).parent
    paths = [str(here), str(here.parents[1] / "plugins" / "shard-llama" / "tests")]  # llama_cases (conftest.py)
    code = f"import sys; sys.path[:0] = {paths!r}; import test_llama_gpu as t; print(t.run_in_fresh_process({how!r}))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{how}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def test_a_user_s_nccl_only_group_runs_every_default_path_on_cuda():
    out = _child("user-nccl-only")
    assert "'backend': 'nccl'" in out, out


def test_the_group_shardcore_starts_runs_every_default_path_on_cuda():
    out = _child("init_from_env")
    assert "cuda:nccl" in out and "cpu:gloo" in out, out


@pytest.mark.parametrize(
    "switch", ["enable_fused_normalization", "enable_jit_fused", "enable_flash_attention", "enable_all_optimization"]
)
def test_the_kernel_switches_match_the_model_in_bf16_on_cuda(switch):
    import shardcore

    torch.manual_seed(0)
    ref = build("LlamaForCausalLM", kv=2).cuda().to(torch.bfloat16)
    model = shardcore.optimize(copy.deepcopy(ref), ShardConfig(tensor_parallel_size=1, **{switch: True}))
    batch = _cuda(lm_batch())
    real = batch["attention_mask"].bool()
    out, want = model(**batch), ref(**batch)
    _close(out.logits[real], want.logits[real], f"{switch}: logits", tol=3e-2)
    out.loss.backward(), want.loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        scale = q.grad.float().abs().max().clamp_min(1e-3)
        err = (p.grad.float() - q.grad.float()).abs().max() / scale
        assert err < 5e-2, f"{switch}: {name} gradient off by {err:.3g} of its largest entry (bf16)"
