"""timm VisionTransformer models (vit_*, deit_*) sharded against the unsharded model."""

from __future__ import annotations

import pytest
from vit_cases import timm_batch, timm_build, timm_loss

from shardcore import ShardConfig
from shardcore.testing import RankPool, assert_sharded_matches, refusal_message, run_on_ranks


def _check(tp: int, name: str, **kwargs) -> dict:
    kwargs.setdefault("depth", 2)  # the model's width and heads, two blocks (vit_tiny runs full depth below)
    return assert_sharded_matches(
        lambda: timm_build(name, **kwargs), timm_batch(), ShardConfig(tensor_parallel_size=tp), loss_fn=timm_loss
    )


@pytest.mark.parametrize(
    ("name", "tp"),
    [
        ("vit_tiny_patch16_224", 3),  # 3 heads on 3 ranks
        ("vit_small_patch16_224", 2),  # 6 heads
        ("vit_small_patch16_224", 3),
        ("deit_small_patch16_224", 2),
    ],
)
def test_timm_models(name, tp):
    run_on_ranks(tp, _check, tp, name)


def test_timm_full_depth():
    run_on_ranks(3, _check, 3, "vit_tiny_patch16_224", depth=12)


@pytest.mark.parametrize(
    "variant",
    [{"global_pool": "avg"}, {"reg_tokens": 4}, {"class_token": False, "global_pool": "avg"}],
    ids=["avg-pool", "register-tokens", "no-class-token"],
)
def test_timm_variants(variant):
    run_on_ranks(2, _check, 2, "vit_small_patch16_224", **variant)


def _qkv_split_per_head() -> bool:
    """Rank r's qkv rows are its heads' rows of q, k and v, not a contiguous block."""
    import torch
    import torch.distributed as dist

    import shardcore

    torch.manual_seed(0)
    native = timm_build("vit_small_patch16_224", depth=2)
    full = native.blocks[0].attn.qkv.weight.detach().clone()
    model = shardcore.optimize(native, ShardConfig(tensor_parallel_size=2))
    local = model.blocks[0].attn.qkv.weight.detach()
    q, k, v = full.chunk(3)
    r = dist.get_rank()
    want = torch.cat([part.chunk(2)[r] for part in (q, k, v)])
    return torch.equal(local, want) and model.blocks[0].attn.num_heads == 3


def test_qkv_is_split_per_head():
    assert all(run_on_ranks(2, _qkv_split_per_head))


def _timm_only() -> list:
    """Shard a timm ViT with transformers made unimportable (a user with only timm installed)."""
    import sys

    assert "transformers" not in sys.modules, "this worker must not have imported transformers"
    sys.modules["transformers"] = None  # any `import transformers` now raises ImportError
    report = _check(2, "vit_tiny_patch16_224", num_heads=2, embed_dim=64)
    return [report["max_abs_diff_outputs"], "transformers" in sys.modules and sys.modules["transformers"] is None]


def test_timm_without_transformers():
    pool = RankPool(2)  # fresh workers: nothing imported transformers in them yet
    try:
        results = pool.run(_timm_only)
    finally:
        pool.close()
    assert all(blocked for _, blocked in results)


def _error(tp: int, name: str) -> str:
    return refusal_message(lambda: timm_build(name), ShardConfig(tensor_parallel_size=tp))


def test_heads_not_divisible():
    messages = run_on_ranks(2, _error, 2, "vit_tiny_patch16_224")
    assert all("timm VisionTransformer: num_heads=3 is not divisible by tensor_parallel_size=2" in m for m in messages)


def test_non_vit_timm_model_gets_no_policy_error():
    messages = run_on_ranks(2, _error, 2, "resnet18")
    assert all("No shardcore policy covers timm.models.resnet.ResNet" in m for m in messages), messages


def _dropout_replicas(tp: int) -> list:
    import torch
    import torch.distributed as dist

    import shardcore

    torch.manual_seed(0)
    model = timm_build("vit_small_patch16_224", depth=2, attn_drop_rate=0.3, proj_drop_rate=0.3).train()
    model = shardcore.optimize(model, ShardConfig(tensor_parallel_size=tp))
    with torch.no_grad():
        features = model.forward_features(**timm_batch())  # replicated activations after every block
    every = [torch.empty_like(features) for _ in range(tp)]
    dist.all_gather(every, features)
    return [torch.equal(e, every[0]) for e in every]


def test_dropout_keeps_replicas_in_step():
    """Attention and MLP-inner dropout draw per rank, the projection dropout after attn.proj (on
    replicated activations) from the shared stream: the ranks' activations stay bit-identical."""
    for same in run_on_ranks(2, _dropout_replicas, 2):
        assert all(same)
