"""Mutation testing of the conformance kit: deliberate bugs in the core and the plugins, each of
which the kit's tests must catch (``nox -s mutants``; not a test module, not run by CI: ~10 min).

Each mutant replaces one snippet of one source file (the snippet must occur exactly once, so a
mutant that no longer applies is an error, not a silent pass), in a scratch copy of the
repository, and runs the tests named beside it with the copy first on ``PYTHONPATH``. A mutant
is *caught* when pytest reports failing tests (exit code 1); a collection error or a time-out is
reported as such. The unmutated copy must pass the same tests first. Results go to
``bench-results/mutants.json``.

    python tests/mutants.py [NAME ...]      # all mutants, or the named ones
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
LLAMA = "plugins/shard-llama/tests/test_llama_tp.py"
TIMEOUT_S = 600

#: name -> (what the bug is, file, snippet, replacement, tests that must catch it); snippet and
#: replacement may be tuples of several, applied in order
MUTANTS: dict[str, tuple[str, str, str, str, list[str]]] = {
    "policy-replaces-nothing": (
        "a policy that replaces nothing (Llama's module_policy returns {})",
        "plugins/shard-llama/shard_llama/policy.py",
        "        heads, kv, head_dim = self._dims()\n        tp = self.tp_size\n",
        "        return {}\n        heads, kv, head_dim = self._dims()\n        tp = self.tp_size\n",
        [f"{LLAMA}::test_causal_lm[2]"],
    ),
    "no-replica-grad-sync": (
        "_SyncReplicaGrads removed: replicated KV heads' gradients not summed over their replicas",
        "shardcore/layers/linear.py",
        "        if self._replica_groups is not None:\n            weight = _SyncReplicaGrads",
        "        if False:\n            weight = _SyncReplicaGrads",
        [f"{LLAMA}::test_causal_lm_variants[gqa-4]"],
    ),
    "dropped-backward-all-reduce": (
        "the copy-to-TP backward all-reduce dropped for one layer (Llama's MLP leaves enter_tp_region)",
        "plugins/shard-llama/shard_llama/policy.py",
        'enter_tp_region=["self_attn", "mlp"],',
        'enter_tp_region=["self_attn"],',
        [f"{LLAMA}::test_causal_lm[2]"],
    ),
    "qkv-order-permuted": (
        "q/k/v parts permuted in FusedLinear1D_Col (rank holds [v; k; q] rows)",
        "shardcore/layers/linear.py",
        "        return cls(weight, bias, spec, process_group, copy_input=copy_input)",
        "        weight = torch.cat(weight.detach().chunk(3, dim=1 if cls.transposed else 0)[::-1], 1 if cls.transposed else 0)\n"
        "        return cls(weight, bias, spec, process_group, copy_input=copy_input)",
        ["tests/test_core_toy.py"],
    ),
    "tied-weight-untied": (
        "a tied weight left untied after sharding (the sharder's retie skipped)",
        "shardcore/sharder.py",
        "        for places in shared:\n",
        "        for places in shared[:0]:\n",
        [f"{LLAMA}::test_causal_lm_variants[tied-2]"],
    ),
    "vocab-padding-leaks": (
        "vocab padding columns leak into vocab-parallel logits (LM head keeps its padded slice)",
        "shardcore/layers/embedding.py",
        "        return logits[..., : self.vocab_end - self.vocab_start]",
        "        return logits",
        [f"{LLAMA}::test_parallel_output_vocab_parallel_loss[vocab1001-2]"],
    ),
    "attention-dropout-shared-stream": (
        "attention dropout on the shared random stream (every rank drops the same positions of its heads)",
        "shardcore/layers/rng.py",
        "    _wrap(module, lambda device: fork_tp_rng(group, device))",
        "    _wrap(module, _shared_stream)",
        ["plugins/shard-bert/tests/test_bert_dropout.py"],
    ),
    "residual-dropout-per-rank": (
        "GPT-2's residual dropout inside attention left on the per-rank stream (shared_rng dropped)",
        "plugins/shard-gpt2/shard_gpt2/policy.py",
        'shared_rng=["attn.resid_dropout"],',
        "shared_rng=[],",
        ["plugins/shard-gpt2/tests/test_gpt2_tp.py::test_dropout_keeps_replicas_in_step"],
    ),
    "error-after-collective": (
        "a refusal raised after a collective, where one rank's error leaves the others waiting "
        "(the policy's checks moved behind the same-weights all-gather)",
        "shardcore/sharder.py",
        ("    policy.config_sanity_check()\n", "    _check_same_weights(model, group)\n"),
        ("", "    _check_same_weights(model, group)\n    policy.config_sanity_check()\n"),
        ["tests/test_core_config.py::test_bad_input_fails_on_every_rank_without_hanging"],
    ),
    "dcp-wrong-rows": (
        "load_distributed assembling a rank's slice from another rank's rows",
        "shardcore/checkpoint/dcp.py",
        "    for start, stop, pad in spec.ranges(rank):",
        "    for start, stop, pad in spec.ranges((rank + 1) % spec.tp_size):",
        ["tests/test_core_dcp.py"],
    ),
    "smallest-gradient-sign-flip": (
        "the sign of the model's smallest gradient flipped (Llama layer 1's post_attention_layernorm)",
        "plugins/shard-llama/shard_llama/policy.py",
        '                per_rank_rng=["self_attn"],  # attention dropout drops this rank\'s heads\n',
        '                per_rank_rng=["self_attn"],  # attention dropout drops this rank\'s heads\n'
        "                param_replacement=[lambda m: m.post_attention_layernorm.weight.register_hook(lambda g: -g) "
        "if m.self_attn.layer_idx == 1 else None],\n",
        [f"{LLAMA}::test_causal_lm[2]"],
    ),
    "whisper-finds-no-layers": (
        "Whisper's structural probe finds no layers (nothing would be sharded)",
        "plugins/shard-whisper/shard_whisper/policy.py",
        '    return hasattr(module, "self_attn") and hasattr(module, "fc1")',
        "    return False",
        ["plugins/shard-whisper/tests/test_whisper_tp.py::test_whisper_classes[WhisperModel-2]"],
    ),
}


def _copy() -> pathlib.Path:
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="shardcore-mutant-"))
    ignore = shutil.ignore_patterns(".nox", ".git", "__pycache__", "bench-results", "*.egg-info", ".ruff_cache")
    for name in ("shardcore", "plugins", "tests", "pyproject.toml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(
            src, scratch / name, **({"ignore": ignore} if src.is_dir() else {})
        )
    return scratch


def _run(scratch: pathlib.Path, tests: list[str]) -> tuple[str, float]:
    plugins = [str(p) for p in sorted((scratch / "plugins").iterdir()) if (p / "pyproject.toml").is_file()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(scratch), *plugins]), "PYTHONHASHSEED": "0"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - start
    outcome = {0: "passed", 1: "caught"}.get(proc.returncode, f"pytest exit {proc.returncode}")
    return outcome, time.perf_counter() - start


def main(names: list[str]) -> int:
    chosen = {n: MUTANTS[n] for n in names} if names else MUTANTS
    scratch = _copy()
    try:
        baseline, seconds = _run(scratch, sorted({t for *_, tests in chosen.values() for t in tests}))
        print(f"baseline (no mutant): {baseline} in {seconds:.0f} s")
        if baseline != "passed":
            print("the unmutated tests must pass first")
            return 2
        results = []
        for name, (what, file, old, new, tests) in chosen.items():
            target = scratch / file
            original = mutated = target.read_text()
            olds, news = (old, new) if isinstance(old, tuple) else ((old,), (new,))
            for snippet, replacement in zip(olds, news, strict=True):
                if mutated.count(snippet) != 1:
                    raise SystemExit(
                        f"mutant {name}: a snippet occurs {mutated.count(snippet)} times in {file}, not once"
                    )
                mutated = mutated.replace(snippet, replacement)
            target.write_text(mutated)
            try:
                outcome, seconds = _run(scratch, tests)
            finally:
                target.write_text(original)
            results.append(
                {
                    "mutant": name,
                    "bug": what,
                    "file": file,
                    "tests": tests,
                    "outcome": outcome,
                    "seconds": round(seconds, 1),
                }
            )
            print(f"{outcome:>8}  {seconds:5.0f} s  {name}: {what}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    caught = sum(r["outcome"] == "caught" for r in results)
    print(f"mutation score: {caught}/{len(results)} caught")
    out = ROOT / "bench-results" / "mutants.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"caught": caught, "total": len(results), "mutants": results}, indent=2))
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
