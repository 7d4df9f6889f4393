"""What the cost model reads off a model sharded on paper (``shardcore explain``'s build): per
pipeline stage, the matmul weights a token passes through, the activation elements a token leaves
for the backward, the attention a token computes; and the model's hidden width for the stage
boundaries. Model-agnostic: modules are recognised by their tensors, not their classes."""

from __future__ import annotations

import attrs
from torch import nn

from ..expert_parallel import expert_modules
from ..sequence import heads_of
from .sides import matmul_sides


@attrs.frozen
class StageFacts:
    """One pipeline stage's work per token on this rank (everything at ``pp = 1``)."""

    #: weights a token multiplies by (2 FLOPs each forward); experts counted by the share a token uses
    matmul_weights: float
    #: activation elements a token leaves for the backward: each tensor a matmul's backward reads, once
    #: (:func:`~.sides.matmul_sides`; each matmul's input and output where no tensor-parallel role is known)
    activation_elements: float
    #: attention layers on the stage (their score FLOPs depend on the sequence)
    attention_layers: int
    #: dense (non-expert) parameter bytes and expert parameter bytes on the stage
    dense_bytes: int
    expert_bytes: int
    #: dense parameter tensors (one FSDP/DDP unit each at most) and the stage's blocks
    dense_tensors: int
    blocks: int
    #: of ``matmul_weights``, those after the last block (the head: on the whole sequence under
    #: sequence parallelism), and the widest output there (the logits a token gets on this rank)
    tail_weights: float = 0.0
    logits: int = 0
    #: the bytes of each parameter tensor the stage's rank holds, dense and expert (an optimizer's
    #: step runs tensor by tensor: its rate depends on each tensor's size, not on their mean)
    dense_sizes: tuple[int, ...] = ()
    expert_sizes: tuple[int, ...] = ()
    #: of ``dense_bytes``, those outside the blocks (embeddings, head, final norm: FSDP's root unit)
    end_bytes: int = 0
    #: elements a token's norms keep in float32 for the backward (each norm's input, its weight's size)
    norm_elements: float = 0.0
    #: of ``activation_elements``, those kept as the rank's part of the sequence under ``split_gather``: the
    #: region's entries (the input its column-parallel layers read) and the norms' normalized copies
    wide_elements: float = 0.0
    #: per parameter in module order: ``(its bytes on the rank, an expert's, the activation elements and the norm
    #: elements a token leaves with it)``; the backward walks it in reverse (:func:`backward_peak`)
    walk: tuple[tuple[int, bool, float, float], ...] = ()
    #: the parameters after the last block (the head, the final norm; a tied head's weight too): their bytes, whose
    #: gradients the backward allocates first, and their entries at the end of ``walk``
    tail_bytes: int = 0
    tail_walk: int = 0
    #: the dense parameter bytes of the stage's largest block (FSDP's largest unit but the root)
    largest_block: int = 0
    #: of ``matmul_weights``, the experts' (the share a token uses), and that share: a rank's expert multiplies
    #: ``share`` of its microbatch's rows (small matmuls: the cost model prices them at that row count's rate)
    expert_weights: float = 0.0
    expert_share: float = 1.0


def _is_embedding(module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding) or "Embedding" in type(module).__name__


def _expert_share(model: nn.Module, ep: int) -> float:
    """The share of a rank's fused expert weights one of its tokens uses: each token picks ``top_k``
    of the ``E`` experts, a rank holds ``E / ep`` of them (all at ``ep = 1``) and serves the tokens
    of ``ep`` ranks."""
    cfg = getattr(model, "config", None)
    top_k = getattr(cfg, "num_experts_per_tok", None) or 1
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or top_k
    return min(1.0, top_k * ep / experts)


def _expert_rows(model: nn.Module) -> float | None:
    """Rows a token leaves in each fused expert matmul's activations on every rank, where transformers 5 runs its
    experts batched (``grouped_mm``, its default: every choice of the rank's tokens sorted into one tensor,
    another rank's experts' too, skipped by the kernel but allocated): ``top_k``. ``None`` for its per-expert
    loop (``eager``), which gathers only the rows its experts serve (the share a token uses)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_experts_implementation", None) in (None, "eager"):
        return None
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(text, "num_experts_per_tok", None) or getattr(cfg, "num_experts_per_tok", None) or 1


def stage_facts(model: nn.Module, blocks: list[str], pp: int, ep: int, walk: list | None = None) -> list[StageFacts]:
    """``blocks`` split as explain's stage bytes split them (earlier stages take the remainder;
    what precedes the first block on the first stage, the rest on the last). ``walk``:
    :func:`parameter_walk` of ``model`` and ``blocks``, when already made (it does not depend on
    ``pp`` or ``ep``)."""
    per = [len(blocks) // pp + (1 if s < len(blocks) % pp else 0) for s in range(pp)]
    stage_of, i = {}, 0
    for s, n in enumerate(per):
        for b in blocks[i : i + n]:
            stage_of[b] = s
        i += n
    share, rows = _expert_share(model, ep), _expert_rows(model)
    acc = [
        dict(
            mm=0.0, act=0.0, dense=0, expert=0, tensors=0, tail=0.0, logits=0, sizes=([], []), ends=0, norm=0.0, wide=0
        )
        | {"walk": [], "after": 0, "after_walk": 0, "units": {}, "ids": set(), "expert_mm": 0.0}
        for _ in range(pp)
    ]
    for owner, tail, p, module, expert, kept in parameter_walk(model, blocks) if walk is None else walk:
        stage = stage_of[owner] if owner is not None else (pp - 1 if tail else 0)
        seen = id(p) in acc[stage]["ids"]  # a tied weight is held once on each stage that uses it (its copy there)
        acc[stage]["ids"].add(id(p))
        before, dense, act, norm = (acc[stage][k] for k in ("mm", "dense", "act", "norm"))
        _add_param(acc[stage], p, module, expert, seen, share, rows, kept)
        held = 0 if seen else p.numel() * p.element_size()
        acc[stage]["walk"].append((held, expert, acc[stage]["act"] - act, acc[stage]["norm"] - norm))
        acc[stage]["ends"] += acc[stage]["dense"] - dense if owner is None else 0
        if owner is not None and not expert:
            acc[stage]["units"][owner] = acc[stage]["units"].get(owner, 0) + held
        if tail:
            acc[stage]["after"] += 0 if expert else p.numel() * p.element_size()
            acc[stage]["after_walk"] += 1
        if owner is not None and kept:  # a region's entry: its input, kept as the rank's part of the sequence
            acc[stage]["wide"] += kept[1]
        if tail and acc[stage]["mm"] > before:
            acc[stage]["tail"] += acc[stage]["mm"] - before
            acc[stage]["logits"] = max(acc[stage]["logits"], p.shape[0])
    return [_stage(a, per[s], share) for s, a in enumerate(acc)]


def _stage(a: dict, blocks: int, share: float) -> StageFacts:
    """One stage's figures as :func:`stage_facts` gathered them."""
    units = max(a["units"].values(), default=0)
    return StageFacts(
        a["mm"],
        a["act"],
        blocks,
        a["dense"],
        a["expert"],
        a["tensors"],
        blocks,
        a["tail"],
        a["logits"],
        tuple(a["sizes"][0]),
        tuple(a["sizes"][1]),
        a["ends"],
        a["norm"],
        a["wide"],
        tuple(a["walk"]),
        a["after"],
        a["after_walk"],
        units,
        a["expert_mm"],
        share,
    )


def parameter_walk(model: nn.Module, blocks: list[str], roles: dict[int, str] | None = None) -> list[tuple]:
    """Each use of a parameter, in module order: ``(its block or None, after the blocks (the tail),
    the parameter, its module, an expert's, its tensor-parallel matmul's kept sides)`` (:func:`matmul_sides`;
    ``roles``: as there, where the model is not sharded); a tied parameter once per use."""
    experts = {id(p) for m in expert_modules(model) for p in m.parameters()}
    block_set, seen_block, out = set(blocks), False, []
    sides = matmul_sides(model, roles)
    for name, module in model.named_modules(remove_duplicate=False):
        owner = _owner(name, block_set)
        tail = owner is None and seen_block
        seen_block = seen_block or owner is not None
        for p in module.parameters(recurse=False):
            kept = sides.get(id(module)) if p is getattr(module, "weight", None) else None
            out.append((owner, tail, p, module, id(p) in experts, kept))
    return out


def _owner(name: str, blocks: set[str]) -> str | None:
    """The block ``name`` is, or lies in (its shortest dotted prefix among ``blocks``), else ``None``."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if prefix in blocks:
            return prefix
    return None


def _add_param(
    acc: dict, p, module: nn.Module, expert: bool, seen: bool, share: float, rows: float | None, kept
) -> None:
    """One parameter's part: held bytes once (tied ones count once), matmul work per use; ``kept``: its
    tensor-parallel matmul's sides (:func:`matmul_sides`), else each matmul's input and output are counted."""
    if not seen:
        acc["expert" if expert else "dense"] += p.numel() * p.element_size()
        acc["tensors"] += 0 if expert else 1
        acc["sizes"][1 if expert else 0].append(p.numel() * p.element_size())
    if p.dim() == 1 and p is getattr(module, "weight", None) and "norm" in type(module).__name__.lower():
        acc["norm"] += p.numel()  # its input, upcast to float32 and kept (measured: about 17% of a layer)
        if not type(module).__module__.startswith(("torch.", "shardcore.")):  # a norm written in Python (the
            acc["act"] += p.numel()  # model's own) keeps the normalized input too, for its weight's product
            acc["wide"] += p.numel()  # on the rank's part of the sequence under split_gather, as its input
    if p.dim() < 2 or _is_embedding(module):
        return
    if expert or p.dim() > 2:  # fused experts [experts here, out, in]: a token visits top_k of them
        acc["mm"] += p.numel() * share
        acc["expert_mm"] += p.numel() * share
        batched = rows is not None and p.dim() == 3 and p.shape[0] == getattr(module, "num_experts", None)
        per = rows if batched else p.shape[0] * share
        acc["act"] += (p.shape[-1] + p.shape[-2]) * per
        if batched and p is getattr(module, "gate_up_proj", None) and getattr(module, "has_gate", True):
            out = p.shape[-1] if getattr(module, "is_transposed", False) else p.shape[-2]
            acc["act"] += out // 2 * per  # the gate's activation, kept beside gate and up for the product's backward
    elif p.dim() == 2:
        acc["mm"] += p.numel()
        acc["act"] += kept[0] if kept else p.shape[0] + p.shape[1]


def attention_width(model: nn.Module, policy, tp: int) -> tuple[int, int, bool]:
    """``(heads on a rank, head dim, causal)`` of the model's attention, from its config."""
    cfg = getattr(model, "config", None)
    try:
        heads = heads_of(policy)[0]
    except NotImplementedError:
        heads = getattr(cfg, "num_attention_heads", 0) or 0
    hidden = hidden_size(model)
    dim = getattr(cfg, "head_dim", None) or (hidden // heads if heads else 0)
    causal = bool(getattr(cfg, "is_decoder", False)) or type(model).__name__.endswith("ForCausalLM")
    return max(1, heads // tp) if heads else 0, dim, causal


def hidden_size(model: nn.Module) -> int:
    cfg = getattr(model, "config", None)
    for name in ("hidden_size", "d_model", "n_embd", "embed_dim"):
        value = getattr(cfg, name, None)
        if isinstance(value, int):
            return value
    return 0


def gathered_bytes(stage: StageFacts, mode: str | None, dp: int) -> float:
    """The weights data parallelism holds whole beside the rank's shards at the step's peak: ZeRO-2
    every block's (from its forward to its backward); FSDP and HSDP the root unit's (embeddings, head,
    final norm: the root is not resharded after its forward) and two blocks' (the one computing and the
    next, prefetched). Measured on tracked ranks (:mod:`shardcore.cost.tracked`): FSDP x TP's peak was
    12-18% under without them. Read on pipeline stages; without a pipeline ``cost.memory`` walks FSDP's backward."""
    if dp == 1 or mode not in ("zero2", "fsdp", "hsdp"):
        return 0
    if mode == "zero2":
        return stage.dense_bytes
    return stage.end_bytes + 2 * (stage.dense_bytes - stage.end_bytes) / max(stage.blocks, 1)


def loss_bytes_per_token(facts: dict, stage: StageFacts, sp: int = 1, *, pipelined: bool = False) -> float:
    """Per token of the rank's share, what the loss holds beside what the head's matmul is counted for,
    at the end of a forward (one microbatch's at a time): the float32 copy of the rank's logits, and
    where the full logits are gathered over ``facts["logits_gathered"]`` ranks (``tp > 1``,
    ``parallel_output=False``) the gather's buffer and the logits it is laid out into, each the whole
    vocabulary. Under sequence parallelism the head sees the whole sequence, ``sp`` times the rank's
    share. A pipeline's last stage (``pipelined``) computes the model's own loss (transformers'
    ``ForCausalLMLoss``) on the full logits instead: the logits, their float32 copy, its log-softmax
    kept for the backward and the backward's float32 gradient, each the whole vocabulary (14 bytes an
    entry in bf16). Both measured on tracked ranks (:mod:`shardcore.cost.tracked`)."""
    ranks = facts.get("logits_gathered", 1)
    if pipelined:
        return sp * stage.logits * ranks * (facts["itemsize"] + 3 * 4)
    loss = stage.logits * 4 + (2 * ranks * stage.logits * facts["itemsize"] if ranks > 1 else 0)
    return sp * loss + (sp - 1) * stage.logits * facts["itemsize"]


#: the optimizer step's own temporaries, in tensors the size of the largest the rank updates: torch's AdamW tensor
#: by tensor (its CPU path; measured on the tracked rank: the second moment's square root, its quotient and the
#: update beside each other), SGD's weight-decayed gradient. CUDA's default, ``foreach``, keeps a group's worth
OPTIMIZER_TEMPS = {"adamw": 3, "sgd": 1, "none": 0}


def step_temporaries(stage: StageFacts, optimizer: str, shard: int) -> int:
    """Bytes the optimizer's step holds beside the parameters, gradients and its state on a rank of ``stage``
    (``shard``: the data-parallel ranks a dense tensor is split over)."""
    largest = max((*(d / shard for d in stage.dense_sizes), *stage.expert_sizes), default=0)
    return int(OPTIMIZER_TEMPS[optimizer] * largest)


def backward_peak(stage: StageFacts, one: float, itemsize: int, shard: int) -> tuple[float, float]:
    """``(gradient bytes held, activation bytes freed)`` where a backward through ``stage`` holds the most beside the
    activations it started with (``one``: a microbatch's, kept): it walks the parameters in reverse, each allocating
    its gradient (dense ones ``1 / shard``: FSDP's reduce-scattered) before its inputs are freed (their share of
    ``one``). Large gradients late in the walk (a first stage's embeddings) peak at its end, with the microbatch's
    activations gone; large early ones (a MoE's experts) near its start, with them all held."""
    weights = [act * itemsize + norm * 4 for _, _, act, norm in stage.walk]  # the norms' inputs kept in float32
    total = sum(weights) or 1.0
    held = freed = 0.0
    best = (0.0, 0.0)
    for (grad, expert, _, _), weight in zip(reversed(stage.walk), reversed(weights), strict=True):
        held += grad if expert else grad / shard
        if held - freed > best[0] - best[1]:
            best = (held, freed)
        freed += one * weight / total
    return best
