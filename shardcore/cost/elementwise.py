"""The work a model does besides its matmuls: its norms, activations, rotary embeddings, residual adds, routing and
the copies between them, each a pass over its tensors' bytes. The reference block whose rate prices a model's FLOPs
(``calibrate``'s ``block_flops``) holds some of it; a narrow model, or one with a router, holds more per FLOP (one
core, alone: a 512-wide Llama took 10% more than its FLOPs at the reference's rate, a 256-wide Mixtral 20%), a wide
one less.

Traced, not guessed: :func:`trace` runs the model's forward and backward once on the meta device (nothing allocated)
under a dispatch mode that sums, per aten op that is neither a matmul nor attention nor a view, the bytes of the
tensors it reads and writes. A tensor as wide as the residual stream stays whole on every tensor-parallel rank, a
narrower or wider one is split; a tensor without a dimension of the tokens is paid once per forward call (the
embedding's gradient, a bias's), every other once per token. Attention through ``scaled_dot_product_attention`` is
one fused kernel on the devices (its FLOPs priced with the block's), so the trace takes it whole, not as the meta
device decomposes it.

:mod:`shardcore.cost.excess` prices those bytes at the profile's ``elementwise_bytes_per_s`` (``calibrate`` times a
chain of such ops, :class:`Chain`, traced the same way, at the bytes per op the model's ops have) and takes off the
reference block's own, which its measured rate already holds: a model with the reference's elementwise bytes per
FLOP costs what its FLOPs say.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: ops priced by their FLOPs (the block rate), not their bytes
MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "linear", "matmul"})
#: ops that move no bytes: views that do not say so in their schema, allocations left unwritten
NO_BYTES = frozenset(
    {"_unsafe_view", "_reshape_alias", "lift_fresh", "empty", "empty_like", "new_empty", "empty_strided"}
)


class _Attention(torch.autograd.Function):
    """``scaled_dot_product_attention`` as the fused kernel it is on a device: its output's shape, no decomposition."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.inputs = (q, k, v)
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    @staticmethod
    def backward(ctx, grad):
        return tuple(torch.empty_like(t) for t in ctx.inputs)


class _Fused(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            kwargs = dict(kwargs or {})
            q, k, v = (*args, *(kwargs.pop(n) for n in ("query", "key", "value") if n in kwargs))[:3]
            return _Attention.apply(q, k, v)
        return func(*args, **(kwargs or {}))


class _Counter(TorchDispatchMode):
    """Per op that moves bytes (see the module docstring): its bytes, by how they scale."""

    def __init__(self, hidden: int, tokens: int, skip_last: int | None) -> None:
        super().__init__()
        self.hidden, self.tokens, self.skip_last = hidden, tokens, skip_last
        self.ops, self.whole, self.split, self.fixed = 0, 0, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if name == "_grouped_mm" and args[0].dtype == torch.float32:  # the meta kernel takes 16-bit only; a CPU any
            half = [a.to(torch.bfloat16) if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
            return func(*half, **kwargs).to(torch.float32)
        out = func(*args, **kwargs)
        if name in MATMULS or name in NO_BYTES or any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view (or an in-place op's self, counted among its inputs)
        tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        if self.skip_last and any(t.dim() and t.shape[-1] == self.skip_last for t in tensors):
            return out  # the loss over the logits: priced by its own measured rate
        self.ops += 1
        for t in (t for t in tensors if t.dim()):  # a scalar moves no bytes
            nbytes = t.numel() * t.element_size()
            if not any(d % self.tokens == 0 for d in t.shape):  # no dimension of the tokens (or their copies)
                self.fixed += nbytes
            elif t.shape[-1] == self.hidden:
                self.whole += nbytes
            else:
                self.split += nbytes
        return out


def count(run, hidden: int, tokens: int, skip_last: int | None = None) -> _Counter:
    counter = _Counter(hidden, tokens, skip_last)
    with _Fused(), counter:
        run()
    return counter


def unpadded(model: nn.Module):
    """The attention registry's context in which ``model``'s mask builders take the batch as unpadded, as a run
    would after reading its all-ones mask (fake tensors cannot be read: transformers builds the whole mask)."""
    from ..spec.attention import attention_registry

    try:
        unpadded = getattr(attention_registry(), "unpadded", None)
    except NotImplementedError:  # no model library's registry: nothing to tell
        unpadded = None
    return unpadded(model) if unpadded is not None else contextlib.nullcontext()


def trace(model: nn.Module, seq: int, hidden: int) -> dict | None:
    """The elementwise bytes of one forward and backward of the meta ``model`` on one sequence of ``seq`` token ids
    (see the module docstring), or of the longest shorter one of which no parameter's or buffer's dimension is a
    multiple: a tensor with a dimension that is (the tokens, their ``top_k`` copies) is paid per token, any other
    per call. ``{"tokens", "ops", "whole", "split", "fixed"}``: bytes per ``tokens`` tokens and per forward call;
    ``None`` where the model does not run on the meta device (its step is then priced by its FLOPs alone)."""
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    vocab = getattr(embeddings, "num_embeddings", None)
    if not isinstance(vocab, int):
        return None
    dims = {d for t in (*model.parameters(), *model.buffers()) for d in t.shape}
    tokens = next((t for t in range(seq, 1, -1) if not any(d % t == 0 for d in dims)), None)  # see the docstring
    if tokens is None:
        return None
    ids = torch.zeros((1, tokens), dtype=torch.long, device="meta")

    def run() -> None:
        out = model(input_ids=ids)
        logits = out if torch.is_tensor(out) else getattr(out, "logits", None)
        if logits is None:
            logits = next(t for t in out.values() if torch.is_tensor(t))
        logits.float().sum().backward()

    try:
        with unpadded(model):
            c = count(run, hidden, tokens, skip_last=vocab)
    except Exception:  # data-dependent control flow, an op without a meta kernel: not traced
        return None
    finally:
        for p in model.parameters():
            p.grad = None
    return {"tokens": tokens, "ops": c.ops, "whole": c.whole, "split": c.split, "fixed": c.fixed}


class Chain(nn.Module):
    """Elementwise work as a transformer block does it, no matmul: an RMS norm as HuggingFace writes it, a gated
    SiLU, the residual add (what ``calibrate`` times for ``elementwise_bytes_per_s``)."""

    WIDTH = 512

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(self.WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return x + torch.nn.functional.silu(h) * h


def chain_bytes(tokens: int) -> tuple[int, int]:
    """``(ops, bytes)`` of one forward and backward of :class:`Chain` on ``tokens`` float32 rows (traced)."""
    with torch.device("meta"):
        chain, x = Chain(), torch.empty(tokens, Chain.WIDTH, requires_grad=True)
    c = count(lambda: chain(x).sum().backward(), Chain.WIDTH, tokens)
    return c.ops, c.whole + c.split + c.fixed
