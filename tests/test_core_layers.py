"""Each parallel layer against its native module, on real gloo ranks: outputs, input and weight
gradients, communication counts, and the full <-> sharded round trip of its parameters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardcore.distributed import prepare_replica_groups
from shardcore.tensor_parallel import (
    ColumnParallelEmbedding1D,
    FusedLinear1D_Col,
    Linear1D_Col,
    Linear1D_Row,
    ShardSpec,
    VocabParallelEmbedding1D,
    VocabParallelLMHead1D,
    count_collectives,
    gather_from_tp,
    vocab_parallel_cross_entropy,
)
from shardcore.testing import run_on_ranks


def _group():
    import torch.distributed as dist

    return dist.group.WORLD


def _check_layer(native: nn.Module, layer, x: torch.Tensor, out_fn=lambda y: y, expected_comm=None):
    """Same output and gradients as ``native``; parameters round-trip exactly."""
    x_ref = x.clone().requires_grad_()
    x_par = x.clone().requires_grad_()
    y_ref = native(x_ref)
    with count_collectives() as comm:
        y = out_fn(layer(x_par))
        y.pow(2).sum().backward()
    y_ref.pow(2).sum().backward()
    torch.testing.assert_close(y, y_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(x_par.grad, x_ref.grad, atol=1e-6, rtol=1e-5)
    for name, param in native.named_parameters():
        local = getattr(layer, name)
        spec = layer.shard_specs.get(name)
        full = local.detach() if spec is None else spec.gather(local, layer.process_group)
        full_grad = local.grad if spec is None else spec.gather(local.grad, layer.process_group)
        assert torch.equal(full, param.detach()), f"{name}: full -> shard -> gather is not exact"
        torch.testing.assert_close(full_grad, param.grad, atol=1e-6, rtol=1e-4)
        if spec is not None:  # and back: re-sharding the gathered tensor gives the local slice
            assert torch.equal(spec.shard(full, layer.tp_rank), local.detach())
        # a state_dict round trip keeps the local slices
        state = {k: v.clone() for k, v in layer.state_dict().items()}
        layer.load_state_dict(state)
        assert all(torch.equal(state[k], v) for k, v in layer.state_dict().items())
    if expected_comm is not None:
        assert dict(comm) == expected_comm, dict(comm)


def _layers(tp: int) -> str:
    torch.manual_seed(0)
    g = _group()
    x = torch.randn(3, 5, 16)

    lin = nn.Linear(16, 24)
    _check_layer(
        lin,
        Linear1D_Col.from_native_module(lin, g, gather_output=True),
        x,
        expected_comm={"all_gather": 1, "all_reduce": 1},
    )
    # heads replicated: 2 KV heads of size 4 on 4 ranks; the layer's replica sub-groups are made
    # beforehand (collective over the world), its constructor only looks them up
    kv = nn.Linear(16, 8)
    if tp == 4:
        import torch.distributed as dist

        fresh = dist.new_group(list(range(4)))  # never prepared
        with pytest.raises(RuntimeError, match=r"not prepared: call shardcore.distributed.prepare_replica_groups"):
            Linear1D_Col.from_native_module(kv, fresh, num_heads=2, head_dim=4)
    prepare_replica_groups(g)
    _check_layer(
        kv,
        Linear1D_Col.from_native_module(kv, g, num_heads=2, head_dim=4),
        x,
        out_fn=lambda y: _gather_replicated(y, tp, 2),
    )

    row = nn.Linear(24, 16)
    _check_layer(
        row,
        Linear1D_Row.from_native_module(row, g, input_is_parallel=False),
        torch.randn(3, 5, 24),
        expected_comm={"all_reduce": 1, "all_gather": 1},
    )

    qkv = nn.Linear(16, 3 * 16)  # 4 heads of 4, packed [q; k; v]
    fused = FusedLinear1D_Col.from_native_module(qkv, g, heads=(4, 4, 4), head_dim=4)
    _check_layer(qkv, fused, x, out_fn=lambda y: _unpack_qkv(y, tp))

    emb = nn.Embedding(101, 16, padding_idx=3)
    ids = torch.randint(0, 101, (3, 7))
    ids[0, 0] = 3
    par = VocabParallelEmbedding1D.from_native_module(emb, g, make_vocab_size_divisible_by=8)
    ref_out, out = emb(ids), par(ids)
    torch.testing.assert_close(out, ref_out)
    out.sum().backward()
    ref_out.sum().backward()
    torch.testing.assert_close(par.shard_specs["weight"].gather(par.weight.grad, g), emb.weight.grad)
    assert torch.equal(par.shard_specs["weight"].gather(par.weight, g), emb.weight.detach())

    # split by columns (a per-head bias table): this rank's heads' columns, gathered or kept split
    table = nn.Embedding(32, 8, padding_idx=0)
    for gather in (True, False):
        table.zero_grad()
        split = ColumnParallelEmbedding1D.from_native_module(table, g, num_heads=8, gather_output=gather)
        spec = split.shard_specs["weight"]
        assert split.weight.shape == (32, 8 // tp) and spec.dim == 1
        with count_collectives() as comm:
            out = split(ids % 32)
        full_out = out if gather else gather_from_tp(out, g, dim=-1)
        assert out.shape[-1] == (8 if gather else 8 // tp)
        assert dict(comm) == ({"all_gather": 1} if gather else {}), dict(comm)
        ref_out = table(ids % 32)
        torch.testing.assert_close(full_out, ref_out)
        w = torch.randn(ref_out.shape, generator=torch.Generator().manual_seed(3))
        (full_out * w).sum().backward()
        (ref_out * w).sum().backward()
        torch.testing.assert_close(spec.gather(split.weight.grad, g), table.weight.grad)
        assert torch.equal(spec.gather(split.weight, g), table.weight.detach())
        assert torch.equal(spec.shard(table.weight.detach(), split.tp_rank), split.weight.detach())
    with pytest.raises(ValueError, match="3 heads cannot be split"):
        ColumnParallelEmbedding1D.from_native_module(nn.Embedding(4, 3), g, num_heads=3)

    head = nn.Linear(16, 101)
    _check_layer(
        head,
        VocabParallelLMHead1D.from_native_module(head, g, make_vocab_size_divisible_by=8),
        x,
        expected_comm={"all_gather": 1, "all_reduce": 1},
    )
    return "ok"


def _gather_replicated(y, tp, n):
    full = gather_from_tp(y, _group(), dim=-1)  # [.., tp * shard]: shard s repeated tp/n times
    return torch.cat(full.chunk(tp, dim=-1)[:: tp // n], dim=-1) if tp > n else full


def _unpack_qkv(y, tp):
    parts = gather_from_tp(y, _group(), dim=-1).chunk(tp, dim=-1)  # per rank: [q_r, k_r, v_r]
    per_rank = [p.chunk(3, dim=-1) for p in parts]
    return torch.cat([torch.cat([r[i] for r in per_rank], dim=-1) for i in range(3)], dim=-1)


@pytest.mark.parametrize("tp", [2, 4])
def test_parallel_layers_match_native(tp):
    assert run_on_ranks(tp, _layers, tp) == ["ok"] * tp


def _cross_entropy(tp: int) -> str:
    torch.manual_seed(0)
    g = _group()
    logits = torch.randn(4, 6, 101, dtype=torch.float64)
    target = torch.randint(0, 101, (4, 6))
    target[0, :2] = -100
    head_spec = ShardSpec.padded(101, tp, 8)
    ((start, stop, _),) = head_spec.ranges(torch.distributed.get_rank())
    local = logits[..., start:stop].clone().requires_grad_()
    full = logits.clone().requires_grad_()
    with count_collectives() as comm:
        loss = vocab_parallel_cross_entropy(local, target, vocab_start=start, process_group=g)
        loss.backward()
    want = F.cross_entropy(full.flatten(0, 1), target.flatten(), ignore_index=-100)
    want.backward()
    torch.testing.assert_close(loss, want.float(), rtol=1e-6, atol=0, msg=f"vocab-parallel loss {loss} vs {want}")
    torch.testing.assert_close(local.grad, full.grad[..., start:stop], rtol=1e-5, atol=1e-7)
    assert dict(comm) == {"all_gather": 1}, dict(comm)
    none = vocab_parallel_cross_entropy(local, target, vocab_start=start, process_group=g, reduction="none")
    torch.testing.assert_close(
        none,
        F.cross_entropy(full.flatten(0, 1), target.flatten(), reduction="none").view(4, 6).float(),
        rtol=1e-6,
        atol=1e-7,
    )
    return "ok"


@pytest.mark.parametrize("tp", [2, 4])
def test_vocab_parallel_cross_entropy(tp):
    assert run_on_ranks(tp, _cross_entropy, tp) == ["ok"] * tp


def test_shard_spec_round_trip_all_layouts():
    full = torch.arange(2 * 40, dtype=torch.float32).view(40, 2)
    for spec in [
        ShardSpec.even(40, 4),
        ShardSpec.padded(37, 4, 3),  # 37 rows padded to 48
        ShardSpec.heads((4, 2, 2), 5, 4),  # q split, k/v replicated on 2 ranks each
        ShardSpec.heads((4, 4), 5, 2),
    ]:
        data = full[: spec.full_size]
        parts = [spec.shard(data, r) for r in range(spec.tp_size)]
        assert all(p.shape[0] == spec.local_size for p in parts)
        assert torch.equal(spec.unshard(parts), data), spec


def _rows(full: torch.Tensor, *ranges: tuple[int, int], pad: int = 0) -> torch.Tensor:
    """Rows ``ranges`` of ``full`` one after the other, then ``pad`` zero rows: a slice written by hand."""
    return torch.cat([full[a:b] for a, b in ranges] + [full.new_zeros(pad, *full.shape[1:])])


def test_each_rank_s_slice_is_the_rows_counted_by_hand():
    """Every layout's slices against rows listed by hand, not against the spec's own arithmetic
    (a round trip through shard and unshard passes whenever the two agree, right or wrong)."""
    full = torch.arange(40, dtype=torch.float32).view(20, 2)  # row i holds 2i, 2i + 1
    cases = {
        "even(8, 2)": (ShardSpec.even(8, 2), {0: _rows(full, (0, 4)), 1: _rows(full, (4, 8))}),
        # q: 4 heads of 2 rows split over 4 ranks; k (rows 8-11) and v (12-15): 2 heads, each on 2 ranks
        "heads((4, 2, 2), 2, 4)": (
            ShardSpec.heads((4, 2, 2), 2, 4),
            {
                0: _rows(full, (0, 2), (8, 10), (12, 14)),
                1: _rows(full, (2, 4), (8, 10), (12, 14)),
                2: _rows(full, (4, 6), (10, 12), (14, 16)),
                3: _rows(full, (6, 8), (10, 12), (14, 16)),
            },
        ),
        # 10 rows padded to 12 over 4 ranks: 3 each, the last rank's past row 9 zeros
        "padded(10, 4, 1)": (
            ShardSpec.padded(10, 4, 1),
            {0: _rows(full, (0, 3)), 1: _rows(full, (3, 6)), 2: _rows(full, (6, 9)), 3: _rows(full, (9, 10), pad=2)},
        ),
    }
    for name, (spec, by_rank) in cases.items():
        data = full[: spec.full_size]
        for rank, want in by_rank.items():
            got = spec.shard(data, rank)
            assert torch.equal(got, want), (
                f"{name}: rank {rank} holds rows {(got[:, 0] / 2).long().tolist()}, not {(want[:, 0] / 2).long().tolist()}"
            )
        assert torch.equal(spec.unshard([by_rank[r] for r in range(spec.tp_size)]), data), f"{name}: unshard"


def test_shard_spec_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"out_features of size 10 is not divisible by tensor_parallel_size=4"):
        ShardSpec.even(10, 4, what="out_features")
    with pytest.raises(ValueError, match=r"3 heads cannot be split over tensor_parallel_size=2"):
        ShardSpec.heads((3,), 8, 2)


def test_a_fork_inside_a_fork_of_the_same_stream_does_not_replay_it():
    """A per-rank block inside a per-rank block (Whisper's encoder layer on split tokens holds its
    per-rank attention): the inner fork keeps drawing from the running stream, not from where the
    stream stood when the outer block entered; the shared stream inside both takes its own steps."""
    from shardcore.tensor_parallel import rng

    rng._STATES.clear()
    torch.manual_seed(0)
    with rng.fork_tp_rng(None):
        flat = [torch.rand(3) for _ in range(3)]
    shared = [torch.rand(2) for _ in range(2)]  # the default stream, untouched by the fork

    rng._STATES.clear()
    torch.manual_seed(0)
    with rng.fork_tp_rng(None):
        nested = [torch.rand(3)]
        with rng.fork_tp_rng(None):
            nested.append(torch.rand(3))
            with rng._shared_stream("cpu"):  # back on the shared stream, inside both
                inside = torch.rand(2)
        nested.append(torch.rand(3))
    after = torch.rand(2)
    assert all(torch.equal(a, b) for a, b in zip(flat, nested, strict=True))
    assert torch.equal(inside, shared[0]) and torch.equal(after, shared[1])


def _reduce_leaves_its_input(tp: int) -> str:
    import torch.distributed as dist

    from shardcore.tensor_parallel import reduce_from_tp

    x = torch.full((2, 3), float(dist.get_rank() + 1), requires_grad=False)
    held = x.clone()
    total = torch.full((2, 3), float(sum(range(1, tp + 1))))
    y = reduce_from_tp(x, _group())  # x is still someone's: summed into a new tensor
    assert torch.equal(x, held) and torch.equal(y, total) and y.data_ptr() != x.data_ptr()
    fresh = held.clone()
    z = reduce_from_tp(fresh, _group(), fresh=True)  # the caller's own partial sum: in place
    assert torch.equal(z, total) and z.data_ptr() == fresh.data_ptr()
    return "ok"


def test_reduce_from_tp_sums_in_place_only_a_fresh_partial_sum():
    assert run_on_ranks(2, _reduce_leaves_its_input, 2) == ["ok"] * 2
