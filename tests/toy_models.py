"""A plain-torch transformer and its shardcore policy, for core tests (no transformers needed)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardcore import ModulePolicyDescription, Policy, SubModuleReplacementDescription
from shardcore.plugin_api import blocks_in, require_divisible
from shardcore.tensor_parallel import (
    FusedLinear1D_Col,
    Linear1D_Col,
    Linear1D_Row,
    VocabParallelEmbedding1D,
    VocabParallelLMHead1D,
)


# --8<-- [start:block]
class ToyBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


# --8<-- [end:block]


class ToyLM(nn.Module):
    """Embedding, ``layers`` blocks, tied LM head; ``forward(ids, labels=None) -> dict``."""

    def __init__(self, vocab: int = 101, dim: int = 64, heads: int = 4, hidden: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        nn.init.normal_(self.embed.weight, std=0.02)  # logits of O(1), as in real LMs
        self.blocks = nn.ModuleList(ToyBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


# --8<-- [start:policy]
class ToyPolicy(Policy):
    """Megatron-style TP for :class:`ToyLM`: packed qkv per head, MLP col/row, vocab-parallel ends."""

    def blocks(self):
        return blocks_in(self.model, self.model.blocks)

    def config_sanity_check(self) -> None:
        block = self.model.blocks[0]
        require_divisible(block.num_heads, self.tp_size, "num_heads", "ToyLM")
        require_divisible(block.fc1.out_features, self.tp_size, "hidden", "ToyLM")

    def module_policy(self):
        block = self.model.blocks[0]
        div = self.shard_config.make_vocab_size_divisible_by
        return {
            ToyBlock: ModulePolicyDescription(
                attribute_replacement={"num_heads": block.num_heads // self.tp_size},
                sub_module_replacement=[
                    SubModuleReplacementDescription(
                        suffix="qkv",
                        target_module=FusedLinear1D_Col,
                        kwargs={"heads": (block.num_heads,) * 3, "head_dim": block.head_dim},
                    ),
                    SubModuleReplacementDescription(suffix="proj", target_module=Linear1D_Row),
                    SubModuleReplacementDescription(suffix="fc1", target_module=Linear1D_Col),
                    SubModuleReplacementDescription(suffix="fc2", target_module=Linear1D_Row),
                ],
            ),
            ToyLM: ModulePolicyDescription(
                sub_module_replacement=[
                    SubModuleReplacementDescription(
                        suffix="embed",
                        target_module=VocabParallelEmbedding1D,
                        kwargs={"make_vocab_size_divisible_by": div},
                    ),
                    SubModuleReplacementDescription(
                        suffix="head", target_module=VocabParallelLMHead1D, kwargs={"make_vocab_size_divisible_by": div}
                    ),
                ],
            ),
        }


# --8<-- [end:policy]


def toy_batch(vocab: int = 101, batch: int = 2, seq: int = 8, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    return {"ids": ids, "labels": torch.roll(ids, -1, 1)}


class ToyPair(nn.Module):
    """A composite of two :class:`ToyLM` parts (``tower``, ``lm``) and glue of its own: a ``mix``
    projection of the tower's logits and an ``adapter`` block (a :class:`ToyBlock` outside every part)
    with its ``out`` projection."""

    def __init__(self, vocab: int = 101, heads: int = 4) -> None:
        super().__init__()
        self.tower = ToyLM(vocab=vocab, heads=heads)
        self.adapter = ToyBlock(64, 4, 128)
        self.out = nn.Linear(64, vocab)
        self.mix = nn.Linear(vocab, vocab)
        self.lm = ToyLM(vocab=vocab, heads=heads)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.lm(ids)["logits"] + self.mix(self.tower(ids)["logits"])
        logits = logits + self.out(self.adapter(self.lm.embed(ids)))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out
