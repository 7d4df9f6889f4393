"""Benchmark (not a test): what the rank-consistency guards cost, at TP=2 on 2 gloo ranks.

    python benchmarks/bench_consistency.py [--out bench-results/consistency.json]

* the input check: forward time of a Llama (hidden 512, 4 layers, vocab 8192; batch 4 x seq 256)
  in steady state (same shapes each call) with ``check_inputs=True`` (the default: checked on the
  first forward and on new shapes only), ``"always"`` (every forward) and ``False``; and the
  per-token time of greedy ``generate`` (32 new tokens, batch 1; checked once per call) with the
  check on and off;
* the sampling sync: the time of the one broadcast of the random state per ``generate`` call
  (measured alone, 200 times).

Medians of repeated runs in one process pair, on and off interleaved, alternating which goes
first (this machine is noisy).
Writes ``--out`` (default ``bench-results/consistency.json``; ``nox -s bench-consistency`` runs it 3
times into ``benchmarks/results/consistency.json``).
"""

from __future__ import annotations

import json
import pathlib
import statistics
import time

CONFIG = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
)


def _measure() -> dict:
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    import shardcore
    from shardcore.consistency import sync_random_state

    settings = {"default": True, "always": "always", "off": False}
    models = {}
    for name, check in settings.items():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
        models[name] = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=2, check_inputs=check))
    ids = torch.randint(0, 8192, (4, 256), generator=torch.Generator().manual_seed(1))
    prompt = ids[:1, :16]
    forward = {name: [] for name in settings}
    generate = {"default": [], "off": []}
    names = list(settings)
    with torch.no_grad():
        for _ in range(2):  # warm-up (the default's first forward checks)
            for name in names:
                models[name](input_ids=ids)
                models[name].generate(prompt, max_new_tokens=4, do_sample=False)
        for i in range(12):
            for name in names[i % 3 :] + names[: i % 3]:  # rotate which runs first
                dist.barrier()
                start = time.perf_counter()
                models[name](input_ids=ids)
                forward[name].append(time.perf_counter() - start)
        for i in range(6):
            for name in ("default", "off") if i % 2 else ("off", "default"):
                dist.barrier()
                start = time.perf_counter()
                models[name].generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False)
                generate[name].append((time.perf_counter() - start) / 32)
        sync = []
        for _ in range(200):
            start = time.perf_counter()
            sync_random_state(None, torch.device("cpu"))
            sync.append(time.perf_counter() - start)
    med = statistics.median
    return {
        "forward_s": {name: med(times) for name, times in forward.items()},
        "generate_s_per_token": {"check": med(generate["default"]), "no_check": med(generate["off"])},
        "rng_sync_s": med(sync),
    }


def main() -> None:
    import argparse

    from shardcore.testing import RankPool

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-results/consistency.json")
    args = parser.parse_args()

    with RankPool(2, threads=1) as pool:
        result = pool.run(_measure)[0]
    f, g = result["forward_s"], result["generate_s_per_token"]
    print(
        f"forward (4 x 256):      default {f['default'] * 1e3:8.2f} ms ({f['default'] / f['off']:.3f}x)   "
        f"always {f['always'] * 1e3:8.2f} ms ({f['always'] / f['off']:.3f}x)   off {f['off'] * 1e3:8.2f} ms"
    )
    print(
        f"generate, per token:    check {g['check'] * 1e3:8.2f} ms   off {g['no_check'] * 1e3:8.2f} ms   "
        f"+{(g['check'] / g['no_check'] - 1) * 100:.1f}%"
    )
    print(f"random-state broadcast: {result['rng_sync_s'] * 1e3:.3f} ms per generate call")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": CONFIG, **result}, indent=2))


if __name__ == "__main__":
    main()
