"""Ring attention (``ring_attn``): key/value blocks passed around the ring and merged by
log-sum-exp give full attention's output and every gradient, with causal, padding (a row that
sees no key at all) and additive masks, grouped K/V heads; sp - 1 shifts forward, sp backward."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shardcore.distributed.collectives import count_collectives
from shardcore.testing import run_on_ranks


def _full_attention(q, k, v, mask, scale):
    k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees no key: 0, as SDPA gives
    return p @ v


def _ring_vs_full(kind: str, fused: bool) -> dict:
    from shardcore.sequence import blocks

    saved = blocks._fused
    if not fused:  # the arithmetic written out, as on devices without the fused CPU kernel
        blocks._fused = lambda q, k, v: False
    try:
        return _compare(kind, fused)
    finally:
        blocks._fused = saved


def _compare(kind: str, fused: bool) -> dict:
    from shardcore.sequence import blocks
    from shardcore.sequence.ring import _RingAttention, zigzag_positions

    assert blocks._fused(*[torch.empty(0)] * 3) == fused

    world, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(0)
    b, heads, heads_kv, length, dim = 2, 6, 2, 4 * world, 8  # 3 query heads per key/value head
    q = torch.randn(b, heads, length, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, heads_kv, length, dim, generator=g, dtype=torch.float64) for _ in range(2))
    weights = torch.randn(b, heads, length, dim, generator=g, dtype=torch.float64)
    pos = torch.arange(length)
    mask = (pos[None, :] <= pos[:, None]).expand(b, 1, length, length).clone()
    if kind in ("padded", "additive"):
        mask[0, :, :, :3] = False  # left padding on the first row: its first 3 queries see no key
    if kind == "additive":
        mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    if kind == "none":
        mask = torch.ones(b, 1, length, length, dtype=torch.bool)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    (_full_attention(*full, mask, dim**-0.5) * weights).sum().backward()

    local = length // world
    if kind == "zigzag":  # the causal rule alone, no mask: each block cut into its zigzag chunks
        mine = zigzag_positions(length, world).view(world, local)[rank]
    else:
        mine = torch.arange(rank * local, (rank + 1) * local)
    part = [t[:, :, mine].clone().requires_grad_() for t in (q, k, v)]
    masks = [mask[:, :, mine][:, :, :, r * local : (r + 1) * local] for r in range(world)]
    with count_collectives() as forward:
        mask_of = masks.__getitem__ if kind not in ("none", "zigzag") else lambda block: None
        out = _RingAttention.apply(*part, mask_of, kind == "zigzag", None, dim**-0.5)
    with count_collectives() as backward:
        (out * weights[:, :, mine]).sum().backward()
    want = _full_attention(q, k, v, mask, dim**-0.5)[:, :, mine]
    report = {"out": (out - want).abs().max().item(), "shifts": (forward["ring_shift"], backward["ring_shift"])}
    for name, mine_grad, ref in zip("qkv", part, full, strict=True):
        report[f"d{name}"] = (mine_grad.grad - ref.grad[:, :, mine]).abs().max().item()
    return report


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "math"])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["causal", "padded", "additive", "none", "zigzag"])
def test_ring_attention_equals_full_attention(world, kind, fused):
    for report in run_on_ranks(world, _ring_vs_full, kind, fused):
        assert report["shifts"] == (world - 1, world), f"ring shifts {report['shifts']} (forward, backward)"
        worst = max(report[key] for key in ("out", "dq", "dk", "dv"))
        assert worst < 1e-12, f"ring attention differs from full attention: {report}"
