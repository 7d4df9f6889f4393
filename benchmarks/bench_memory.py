"""Benchmark (not a test): ``explain``'s predicted memory for one rank against the memory a tracked
rank holds (:mod:`shardcore.cost.tracked`: the fake process-group backend, ``FakeTensorMode``,
PyTorch's ``MemTracker``, two AdamW steps), per category, for Llama-3-8B- and -70B-, Mixtral-8x7B- and
DeepSeek-V3-shaped models.

    python benchmarks/bench_memory.py [--shapes 8b 70b] [--layers 4] [--seqs 4096 8192] [--layouts ...]

Layer shapes, vocabulary (128256) and bf16 are the real ones; ``--layers`` sets the depth (the
tracker's per-module snapshots make a full-depth 70B run take many minutes on this CPU; every
category but the fixed ones, embeddings and head, grows with the layers alike). Each layout runs one
global batch of one sequence per data-parallel rank (a pipeline: two microbatches per rank, 1F1B); the
rank played is ``rank`` of the layout (a pipeline's first or last stage). Prints predicted and
measured GiB per category and the relative error; writes ``--out`` (JSON; default
``benchmarks/results/memory.json``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import warnings

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHAPES = {
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8},
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8},
    # Mixtral-8x7B: 8 experts, 2 a token, vocabulary 32000
    "mixtral": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
    },
    # DeepSeek-V3: MLA attention (query and key/value low-rank projections), 256 routed experts, 8 a token, a
    # shared one, its first layer dense (3 in the model; 1 of --layers here)
    "deepseek": {
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "n_group": 8,
        "topk_group": 4,
        "first_k_dense_replace": 1,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 129280,
    },
}
# the same with value heads as wide as the queries' (192): this CPU's SDPA runs its fused kernel only for equal
# widths, and for MLA's 192/128 the math path, which keeps each head's whole attention matrix for the backward
# (9.4 of 10.4 GiB a layer at TP=8, 4096 tokens); a GPU's memory-efficient kernel keeps no such matrix
SHAPES["deepseek-fused"] = {**SHAPES["deepseek"], "v_head_dim": 192}
#: name: (ShardConfig fields, the rank played, sequences in the global batch)
LAYOUTS = {
    "tp8": ({"tensor_parallel_size": 8}, 0, 1),
    "tp4-sp2-ulysses": (
        {
            "tensor_parallel_size": 4,
            "sequence_parallel_size": 2,
            "enable_sequence_parallelism": True,
            "sequence_parallelism_mode": "all_to_all",
        },
        0,
        1,
    ),
    "tp4-sp2-ring": (
        {
            "tensor_parallel_size": 4,
            "sequence_parallel_size": 2,
            "enable_sequence_parallelism": True,
            "sequence_parallelism_mode": "ring_attn",
        },
        0,
        1,
    ),
    # Megatron's split runs over the TP group itself
    "tp8-split_gather": (
        {"tensor_parallel_size": 8, "enable_sequence_parallelism": True, "sequence_parallelism_mode": "split_gather"},
        0,
        1,
    ),
    "pp2-tp4-first": ({"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "num_microbatches": 2}, 0, 2),
    "pp2-tp4-last": ({"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "num_microbatches": 2}, 4, 2),
    # four stages of one layer each (--layers 4), four microbatches: the first, a middle and the last stage
    "pp4-tp2-first": ({"tensor_parallel_size": 2, "pipeline_parallel_size": 4, "num_microbatches": 4}, 0, 4),
    "pp4-tp2-middle": ({"tensor_parallel_size": 2, "pipeline_parallel_size": 4, "num_microbatches": 4}, 2, 4),
    "pp4-tp2-last": ({"tensor_parallel_size": 2, "pipeline_parallel_size": 4, "num_microbatches": 4}, 6, 4),
    "fsdp2-tp4": ({"tensor_parallel_size": 4, "data_parallel_size": 2, "data_parallel": "fsdp"}, 0, 2),
    "hsdp4-tp2": (
        {"tensor_parallel_size": 2, "data_parallel_size": 4, "data_parallel": "hsdp", "data_parallel_shard_size": 2},
        0,
        4,
    ),
    # the experts over 8 ranks, the rest FSDP (DDP's reducer cannot run on the fake backend: its hook gets no tensor)
    "ep8-fsdp": (
        {"tensor_parallel_size": 1, "expert_parallel_size": 8, "data_parallel_size": 8, "data_parallel": "fsdp"},
        0,
        8,
    ),
    # over an 80 GiB device (with --layers 12 at 70b: 10.4 B parameters whole on one rank)
    "tp1": ({"tensor_parallel_size": 1}, 0, 1),
}


def builder(shape: str, layers: int):
    def build():
        import transformers

        import shardcore

        kinds = {"num_local_experts": "Mixtral", "n_routed_experts": "DeepseekV3"}
        kind = next((k for f, k in kinds.items() if f in SHAPES[shape]), "Llama")
        fields = {"vocab_size": 128256, **SHAPES[shape], "num_hidden_layers": layers, "max_position_embeddings": 8192}
        cfg = getattr(transformers, f"{kind}Config")(**fields)
        cfg._attn_implementation = "sdpa"
        # DeepSeek-V3's experts: one 256-expert tensor of a layer is 30 GB in float32, which init_empty
        # allocates before moving it to meta; the tracker fakes every tensor, buffers too, so meta is enough
        with torch.device("meta") if kind == "DeepseekV3" else shardcore.init_empty():
            return getattr(transformers, f"{kind}ForCausalLM")(cfg).to(torch.bfloat16)

    return build


def main(argv: list[str]) -> int:
    import shardcore
    from shardcore.cost.tracked import memory_check

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8b", "70b"], choices=list(SHAPES))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--cap", type=float, default=80.0, help="GiB a device holds: each peak said to fit or not")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory.json"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")  # the simulated rank's warning that its data checks are off, once each
    rows = []
    for shape in args.shapes:
        for seq in args.seqs:
            for name in args.layouts:
                fields, rank, batch = LAYOUTS[name]
                start = time.perf_counter()
                check = memory_check(builder(shape, args.layers), shardcore.ShardConfig(**fields), seq=seq,
                                     batch=batch, rank=rank, cap_gb=args.cap)  # fmt: skip
                row = {"shape": shape, "layers": args.layers, "seq": seq, "layout": name, "rank": rank, **check}
                row["seconds"] = round(time.perf_counter() - start, 1)
                rows.append(row)
                cells = "  ".join(
                    f"{k} {v['predicted'] / 2**30:.2f}/{v['measured'] / 2**30:.2f} GiB ({v['error']:+.1%})"
                    for k, v in check.items()
                    if k != "fits" and v["error"] is not None
                )
                fits = check["fits"]
                cells += f"  under {args.cap:g} GiB: explain {fits['predicted']}, tracked {fits['measured']}"
                print(f"{shape} L={args.layers} seq {seq} {name}: {cells}  [{row['seconds']} s]", flush=True)
                out = pathlib.Path(args.out)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps({"unit": "bytes; error = (predicted - measured) / measured", "rows": rows},
                                          indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
