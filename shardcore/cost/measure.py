"""What one rank achieves while every rank of its group works at once: the per-rank half of
``shardcore calibrate``'s profile (:mod:`shardcore.cost.profile`)."""

from __future__ import annotations

import statistics
import time

import torch

from ..distributed.collectives import all_reduce
from ..distributed.objects import barrier, swap
from .attention import measure as attention


def _device() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device()), "nccl"
    return torch.device("cpu"), "gloo"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``seconds = latency + bytes / bandwidth`` over ``(bytes, seconds)`` points, in
    relative error (each point weighted by ``1 / seconds**2``, so the small messages' latency is
    not drowned by the large ones' seconds): ``(latency_s, bytes_per_s)``, each clamped positive."""
    ws = [1.0 / max(t, 1e-12) ** 2 for _, t in points]
    total = sum(ws)
    mean_x = sum(w * x for w, (x, _) in zip(ws, points, strict=True)) / total
    mean_y = sum(w * y for w, (_, y) in zip(ws, points, strict=True)) / total
    var = sum(w * (x - mean_x) ** 2 for w, (x, _) in zip(ws, points, strict=True))
    cov = sum(w * (x - mean_x) * (y - mean_y) for w, (x, y) in zip(ws, points, strict=True))
    slope = max(cov / var if var else 0.0, 1e-15)
    latency = max(mean_y - slope * mean_x, 0.0)
    return latency, 1.0 / slope


def _together(fn, device: torch.device, seconds: float = 0.3) -> float:
    """Seconds per call of ``fn`` while every rank of the world runs it at the same time: as many
    calls on each rank (enough for ``seconds`` on the slowest), started together, timed until every
    rank has finished them (on shared cores, the share of the machine each rank gets)."""
    return _in_rounds({None: fn}, device, 1, seconds)[None]


#: the reference block: width, heads, MLP width, sequences x tokens
BLOCK = (512, 8, 2048, 2, 256)


def block_step_flops(width: int, ffn: int, tokens: int, seq: int, causal: bool = False) -> float:
    """The FLOPs the cost model counts for a transformer block's forward and backward on ``tokens``
    tokens in sequences of ``seq``: 3 x (2 per matmul weight per token + 4 x seq x width per token
    for the attention scores and their weighted sum; half of that when causal)."""
    weights = 4 * width * width + 2 * width * ffn
    return 3 * tokens * (2 * weights + 4 * seq * width * (0.5 if causal else 1.0))


#: the shapes a rank's block is also timed at: tokens per microbatch, and the tensor-parallel
#: degree its heads and MLP are split by (the residual width stays whole). 32 tokens: a pipeline's microbatch
#: under a sequence split, an expert's share of a microbatch (one core: 0.64x the rate at 128, 64 tokens 0.83x)
SHAPE_TOKENS, SHAPE_TP = (32, 128, 512), (1, 2, 4)


class _RankBlock(torch.nn.Module):
    """A tensor-parallel rank's share of a pre-norm block of :data:`BLOCK`'s width: ``1 / tp`` of
    its heads and MLP, the whole residual stream (what a rank computes under TP=``tp``)."""

    def __init__(self, tp: int) -> None:
        super().__init__()
        width, heads, ffn, _, _ = BLOCK
        self.heads, self.dim = heads // tp, width // heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * self.heads * self.dim)
        self.out = torch.nn.Linear(self.heads * self.dim, width)
        self.up, self.down = torch.nn.Linear(width, ffn // tp), torch.nn.Linear(ffn // tp, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, self.dim).permute(2, 0, 3, 1, 4)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.out(attended)
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def _in_rounds(calls: dict, device: torch.device, rounds: int, seconds: float) -> dict:
    """The median of :func:`_rounds` per call."""
    return {key: statistics.median(t) for key, t in _rounds(calls, device, rounds, seconds).items()}


#: a block's rounds (:func:`_blocks`): how many, and the seconds each fills. Four ranks on this project's 2-core
#: CI machine timed the reference block at 17.9-25.3 GFLOP/s a rank in 3 rounds of 0.2 s (three calibrations),
#: 22.5-23.6 in 5 of 1 s; a shared core's scheduling shows in a short round, not in a long one
BLOCK_ROUNDS = (5, 1.0)


def _rounds(calls: dict, device: torch.device, rounds: int, seconds: float) -> dict[object, list[float]]:
    """Seconds per call of each of ``calls`` while every rank runs the same one at once: as many
    calls on each rank as fill ``seconds`` on the slowest, started together, timed until the last
    rank is done; ``rounds`` times through ``calls`` in turn (a drift of the machine's speed meets
    every call alike), each round's figure. A call that fills a round alone (one call a round: a
    CPU's bfloat16 block) runs in 3 rounds at most, each already long."""
    import torch.distributed as dist

    counts = {}
    for key, fn in calls.items():
        count = torch.tensor([max(1, int(seconds / max(_timed(fn, device, 3), 1e-9)))], device=device)
        all_reduce(count, None, op=dist.ReduceOp.MAX, where="calibrate: calls per round")  # NCCL: on the GPU
        counts[key] = int(count)
    times: dict = {key: [] for key in calls}
    for i in range(rounds):
        for key, fn in calls.items():
            if counts[key] == 1 and i >= 3:
                continue
            barrier(where="calibrate: a round starts together")
            start = time.perf_counter()
            for _ in range(counts[key]):
                fn()
            _sync(device)
            barrier(
                where="calibrate: a round ends with the last rank"
            )  # until the last rank is done: a rank the scheduler favoured does not count as faster
            times[key].append((time.perf_counter() - start) / counts[key])
    return times


def _blocks(device: torch.device, dtype: torch.dtype) -> tuple[float, dict[str, dict[str, float]]]:
    """``(block_flops, block_shapes)``: a rank's block (:class:`_RankBlock`) forward and backward at
    :data:`BLOCK`'s shape (2 x 256 tokens, TP=1): its FLOP/s (:func:`block_step_flops`: the
    matmuls with everything around them, norms, softmax and autograd, as a model's blocks run);
    and ``{tp: {tokens: factor}}``, its rate at each of :data:`SHAPE_TOKENS` per microbatch
    (sequences of at most 256) and :data:`SHAPE_TP` over that reference rate (small matmuls run
    below it; the reference shape is one of them, its factor 1). Every shape timed with every rank
    at work on the same one (:func:`_in_rounds`, :data:`BLOCK_ROUNDS`), so that a rank the others left
    idle for a moment does not count as faster."""
    width, _, ffn, batch, seq = BLOCK
    calls, flops = {}, {}
    for tp in SHAPE_TP:
        block = _RankBlock(tp).to(device=device, dtype=dtype)
        for tokens in SHAPE_TOKENS:
            length = min(tokens, seq)
            x = torch.randn(tokens // length, length, width, device=device, dtype=dtype, requires_grad=True)
            calls[tp, tokens] = lambda block=block, x=x: block(x).sum().backward()
            flops[tp, tokens] = block_step_flops(width, ffn, tokens, length) / tp  # every weight and head split tp ways
    seconds = _in_rounds(calls, device, *BLOCK_ROUNDS)
    rate = {key: flops[key] / seconds[key] for key in calls}
    reference = rate[1, batch * seq]
    shapes = {str(tp): {str(n): rate[tp, n] / reference for n in SHAPE_TOKENS} for tp in SHAPE_TP}
    return reference, shapes


#: the optimizers whose step is measured (PyTorch's own, default arguments)
OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-4),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-4, momentum=0.9),
}


#: the tensor sizes (MiB) an optimizer step is measured on, 32 MiB in all each time: on a CPU a
#: step over small tensors runs from cache and is several times faster per byte than over large ones
OPTIMIZER_TENSOR_MIB = (1, 4, 32)


def _optimizer_rate(device: torch.device, name: str) -> dict[str, float]:
    """Parameter bytes per second one ``name`` step updates, per tensor size (float32 parameters
    of :data:`OPTIMIZER_TENSOR_MIB` MiB each, 32 MiB in all)."""
    rates = {}
    for mib in OPTIMIZER_TENSOR_MIB:
        params = [torch.nn.Parameter(torch.ones(mib << 18, device=device)) for _ in range(32 // mib)]
        for param in params:
            param.grad = torch.full_like(param, 1e-3)
        optimizer = OPTIMIZERS[name](params)
        rates[str(mib)] = (32 << 20) / _together(optimizer.step, device)
    return rates


#: the buffer sizes (MiB) a fresh buffer's writing is timed at: a CPU allocator hands a buffer over its threshold
#: (glibc's: at most 32 MiB) newly mapped pages, each faulted in as it is written (one core: 2 GB/s above the
#: threshold, 10-40 below); a GPU's caching allocator hands back what it holds
FRESH_MIB = (8, 30, 34, 96)


def _fresh_rate(device: torch.device) -> dict[str, float]:
    """Bytes per second written into a buffer allocated just before (a data-parallel engine's flat gradient buffer,
    made anew each step), per size in MiB, every rank at once."""
    rates = {}
    for mib in FRESH_MIB:
        src = torch.ones(mib << 18, device=device)
        rates[str(mib)] = (mib << 20) / _together(lambda src=src: torch.empty_like(src).copy_(src), device)
    return rates


#: the rows (of :class:`~shardcore.cost.elementwise.Chain`'s width, float32) the elementwise chain is timed on: from
#: a short microbatch's tensors, in a CPU's caches, to a long one's, beyond the allocator's mmap threshold
ELEMENTWISE_TOKENS = (32, 512, 4096, 16384)


def _elementwise_rate(device: torch.device) -> dict[str, float]:
    """Traced bytes per second (:func:`~shardcore.cost.elementwise.chain_bytes`) of the elementwise chain's forward
    and backward, every rank at once, by the bytes per op it moves at each of :data:`ELEMENTWISE_TOKENS`."""
    from .elementwise import Chain, chain_bytes

    chain, rates = Chain().to(device), {}

    def step(x: torch.Tensor) -> None:
        x.grad = chain.weight.grad = None  # as traced: each gradient written, none accumulated
        chain(x).sum().backward()

    for tokens in ELEMENTWISE_TOKENS:
        x = torch.randn(tokens, Chain.WIDTH, device=device, requires_grad=True)
        ops, nbytes = chain_bytes(tokens)
        rates[str(nbytes // ops)] = nbytes / _together(lambda x=x: step(x), device)
    return rates


#: the logits the loss is timed on: rows x vocabulary, float32 (4 to 128 MiB): a CPU runs the large ones at a third of
#: the small ones' rate per element (they leave its caches), which one size would miss (a TP rank's gathered logits)
LOSS_ROWS, LOSS_VOCAB = (128, 512, 2048, 4096), 8192


def _loss_rate(device: torch.device) -> dict[str, float]:
    """Logit elements per second a cross-entropy's forward and backward runs through (float32, as a model's loss
    upcasts its logits), per logits' size in elements: a log-softmax and its gradient, exponentials, not copies (on a
    CPU several times slower per element than an elementwise pass)."""
    rates = {}
    for rows in LOSS_ROWS:
        logits = torch.randn(rows, LOSS_VOCAB, device=device, requires_grad=True)
        labels = torch.randint(0, LOSS_VOCAB, (rows,), device=device)

        def step(logits=logits, labels=labels) -> None:
            logits.grad = None  # a run's logits hand their gradient on, never accumulate it
            torch.nn.functional.cross_entropy(logits, labels).backward()

        rates[str(logits.numel())] = logits.numel() / _together(step, device)
    return rates


def measure_per_rank(sizes: tuple[int, ...], repeats: int, dtypes: tuple[str, ...]) -> dict:
    """Run on every rank at once: matmul FLOP/s, elementwise bytes/s, a neighbour swap's line fit."""
    import torch.distributed as dist

    device, _ = _device()
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"matmul_flops": {}}
    n = 512
    for name in dtypes:
        a = torch.randn(n, n, device=device).to(getattr(torch, name))
        out["matmul_flops"][name] = 2 * n**3 / _together(lambda a=a: a @ a, device)
    x = torch.ones(8 << 20, device=device)
    out["copy_bytes_per_s"] = 2 * x.numel() * 4 / _together(lambda: x.mul_(1.0), device)
    out["loss_elements_per_s"] = _loss_rate(device)
    out["fresh_bytes_per_s"] = _fresh_rate(device)
    out["elementwise_bytes_per_s"] = _elementwise_rate(device)
    blocks = {name: _blocks(device, getattr(torch, name)) for name in dtypes}
    width, heads, ffn, batch, seq = BLOCK  # the attention beside the reference block's own
    block = (width, heads, batch, seq, block_step_flops(width, ffn, batch * seq, seq))
    out["attention_shapes"] = {n: attention(device, getattr(torch, n), _together, block, blocks[n][0]) for n in dtypes}
    out["block_flops"] = {name: flops for name, (flops, _) in blocks.items()}
    out["block_shapes"] = {name: shapes for name, (_, shapes) in blocks.items()}
    out["optimizer_bytes_per_s"] = {name: _optimizer_rate(device, name) for name in OPTIMIZERS}
    peer = rank ^ 1 if (rank ^ 1) < world else rank
    points = []
    for nbytes in sizes:
        send, recv = torch.ones(nbytes // 4, device=device), torch.empty(nbytes // 4, device=device)

        def exchange(send=send, recv=recv):
            swap(send, recv, peer, where="calibrate: a point-to-point exchange")

        exchange()
        samples = []
        for _ in range(repeats):
            barrier(where="calibrate: an exchange starts together")
            start = time.perf_counter()
            exchange()
            _sync(device)
            samples.append(time.perf_counter() - start)
        points.append((nbytes, statistics.median(samples)))
    latency, bandwidth = fit_line(points)
    out["send_recv"] = {"latency_s": latency, "bytes_per_s": bandwidth, "points": points}
    return out
