"""The family sweep: every causal-LM, masked-LM, seq2seq, image-classification and vision-language
(run on text alone) family of the installed transformers, sharded at TP=2 with no policy passed (a plugin's, else the plans its
config ships: zero-config), on a tiny random config, against the unsharded model.

    python benchmarks/families.py [--only TYPE ...] [--task causal-lm ...] [--out PATH]
    nox -s families

One pool of 2 gloo ranks runs every family. Each family ends as one of:

* ``exact``: the logits, the loss and every gradient (gathered) equal the unsharded model's;
* ``refused``: shardcore said no, naming why (no plugin and no plan, a style or a shape it does
  not split, a check that found the plan wrong), before the first step or at it;
* ``cannot build``: the family does not build (or run unsharded) at the tiny size;
* ``error``: anything else raised: a defect of shardcore or of the family;
* ``wrong``: it ran and an output or a gradient differs, with no error: the worst outcome, which
  the sweep exists to keep at zero.

Writes ``benchmarks/results/families.json`` (every family, its outcome, the reason or the worst
difference, the seconds) and ``families.md`` (the counts and the list), with the transformers version.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "vision-language": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",  # run on text alone: the language model
}
#: a tiny size for every common config field (set where the family's config has the field)
TINY = {
    "hidden_size": 64,
    "initializer_range": 0.1,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 128,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,  # HunYuan-MoE's top-1 renormalized routing leaves its router no gradient
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "d_model": 64,
    "d_ff": 128,
    "d_kv": 16,
    "num_heads": 4,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "num_decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": 128,
    "image_size": 32,
    "patch_size": 8,
    "num_labels": 3,
    "num_kv_shared_layers": 0,
    "rotary_dim": 8,
    "depth": 2,
    "embed_dim": 64,
    "out_hidden_size": 64,
    "vocab_size_per_layer_input": 512,
    "hidden_size_per_layer_input": 16,
    "emb_dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "dim": 64,
    "hidden_dim": 128,
    "expert_ffn_hidden_size": 64,
    "ffn_hidden_size": 128,
    "entity_vocab_size": 64,
    "entity_emb_size": 32,
    "num_experts_per_token": 2,
    "num_expert_group": 1,
    "linear_num_heads": 4,
    "linear_head_dim": 16,
    # Mamba-2 mixers: heads x head size = 2 x hidden; time steps large enough that the decay A_log gets a
    # gradient above the fp32 noise floor in 16 tokens
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_d_ssm": 128,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "mamba_d_state": 16,
    "ssm_state_size": 16,
    "mamba_n_groups": 1,
    "n_groups": 1,
    "mamba_chunk_size": 8,
    "time_step_min": 0.05,
    "time_step_max": 0.5,
}
#: per family, where the common sizes leave its tiny model without a kind of layer it has (a hybrid with no
#: attention layer among its two), or at a size no other family has (each family's own names)
LAYOUT = {
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "zaya": {"num_experts_per_tok": 1},  # its only routing
    # its full-attention heads (512 wide by default, scaled by 1.0: logits up to 512, where the ring's blockwise
    # softmax rounds 30x more than at 16) as small as its sliding ones
    "gemma4_text": {"global_head_dim": 16},
    # an input, a recurrent (looped) and an output layer: the common sizes gave it 1 layer and -7 recurrent ones
    # (its default 8 input and 8 output layers kept), the one layer then run as the loop and as the output layer
    # (reading in its second run the keys its first wrote to the cache)
    "dory": {
        "num_hidden_layers": 3,
        "n_input_layers": 1,
        "n_recurrent_layers": 1,
        "n_output_layers": 1,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    },
}
#: a list per layer, made one entry per tiny layer (its first entries)
PER_LAYER = ("layer_types", "activation_sparsity_pattern", "mlp_layer_types", "attention_layers", "block_types")
ZERO = ("dropout", "dropout_rate", "attention_dropout", "hidden_dropout", "hidden_dropout_prob",
        "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop", "activation_dropout")  # fmt: skip
MAX_PARAMS = 40_000_000  # parameters of one tiny model (each of 2 ranks holds it twice, and its gradients)
EXACT_RTOL = 2e-3  # the worst relative difference (to the tensor's largest entry) of an exact family


def _noise(key: str) -> bool:
    """A config field drawing randomness in training (a dropout, a router's jitter): zero in the tiny
    models, whose comparisons with the unsharded model need the same numbers on both sides."""
    return key in ZERO or "dropout" in key or "jitter" in key or key.endswith("pdrop")


def _mrope(cls) -> bool:
    """Whether a config class's module speaks of multimodal rotary sections (Qwen2-VL and kin)."""
    import inspect

    try:
        return "mrope_section" in inspect.getsource(sys.modules[cls.__module__])
    except (OSError, TypeError, KeyError):
        return False


def _overrides(defaults: dict, sub_configs: dict, mrope: bool = False) -> dict:
    out = {k: v for k, v in TINY.items() if k in defaults and not isinstance(defaults[k], dict | list)}
    if "kv_lora_rank" in defaults and "num_key_value_heads" in out:  # MLA: as many key/value heads as queries
        out["num_key_value_heads"] = out.get("num_attention_heads", 4)
    if (
        mrope and defaults.get("rope_parameters") and "num_attention_heads" in defaults
    ):  # multimodal rotary sections: over the tiny head_dim / 2
        out["rope_parameters"] = {**defaults["rope_parameters"], "mrope_section": [2, 2, 4]}
    layers = out.get("num_hidden_layers", out.get("num_layers"))
    for k in PER_LAYER:
        if layers and isinstance(defaults.get(k), list | tuple) and len(defaults[k]) > layers:
            kinds = list(defaults[k][: layers - 1])  # the first ones, the last layer of a kind not yet seen
            kinds.append(next((x for x in defaults[k] if x not in kinds), defaults[k][layers - 1]))
            out[k] = kinds
    noise = [k for k, v in defaults.items() if isinstance(v, float) and v and _noise(k)]  # training-time randomness
    out.update({k: 0.0 for k in noise})
    for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        if isinstance(defaults.get(k), int):
            out[k] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 0}[k]
    for key, cls in sub_configs.items():
        if isinstance(defaults.get(key), dict):
            given = defaults[key]
            try:  # the sub-config's own defaults (an AutoConfig slot: those of the model type it holds)
                from transformers import CONFIG_MAPPING

                kind = given.get("model_type")
                sub = CONFIG_MAPPING[kind]() if kind in CONFIG_MAPPING else cls()
                sub_defaults = {**sub.to_dict(), **given}
                nested, mrope_sub = getattr(type(sub), "sub_configs", None) or {}, _mrope(type(sub))
            except Exception:
                sub_defaults, nested, mrope_sub = given, {}, False
            out[key] = {**given, **_overrides(sub_defaults, nested, mrope_sub)}
    return out


def tiny_config(model_type: str):
    """The family's config with every common size made tiny (its own defaults elsewhere)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    defaults = cls().to_dict()
    overrides = _overrides(defaults, getattr(cls, "sub_configs", None) or {}, _mrope(cls))
    config = cls(**{**overrides, **LAYOUT.get(model_type, {})})
    config._attn_implementation = "eager"
    return config


def families(tasks: list[str], only: list[str] | None = None) -> list[tuple[str, str, str]]:
    """``(model type, task, model class name)`` of every family of the installed transformers."""
    from transformers.models.auto import modeling_auto

    out = []
    for task in tasks:
        for model_type, name in getattr(modeling_auto, TASKS[task]).items():
            if only and model_type not in only:
                continue
            out.append((model_type, task, name if isinstance(name, str) else name[0]))
    return sorted(set(out))


def _inputs(task: str, config, seed: int = 1) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    text = getattr(config, "get_text_config", lambda **_: config)(decoder=True)
    vocab = getattr(text, "vocab_size", None) or 512
    if task == "image-classification":
        vision = getattr(config, "vision_config", config)
        size = getattr(vision, "image_size", 32)
        size = size[0] if isinstance(size, list | tuple) else size
        channels = getattr(vision, "num_channels", 3)
        return {
            "pixel_values": torch.randn(2, channels, size, size, generator=g),
            "labels": torch.randint(0, config.num_labels, (2,), generator=g),
        }
    ids = torch.randint(3, min(vocab, 512), (2, 8), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if getattr(text, "use_cache", None) is not None:
        batch["use_cache"] = False  # no cache: hybrid (linear-attention) layers build none worth checking
    if task == "seq2seq":
        batch["decoder_input_ids"] = torch.randint(3, min(vocab, 512), (2, 6), generator=g)
        batch["labels"] = batch["decoder_input_ids"].clone()
    return batch


def _loss(output):
    import torch

    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    logits = output.logits if hasattr(output, "logits") else output[0]
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(7))
    return (logits.float() * weights).sum()


def _rel(actual, expected) -> float:
    scale = max(expected.abs().max().item(), 1e-6) if expected.numel() else 1.0
    return (actual.float() - expected.float()).abs().max().item() / scale if expected.numel() else 0.0


def _compare(out_ref, ref_grads: dict, out, loss, grads: dict) -> tuple[str, dict]:
    """``("exact" | "wrong", figures)``: the logits, the loss and every gradient against the unsharded model's."""
    logits_ref = out_ref.logits if hasattr(out_ref, "logits") else out_ref[0]
    logits = out.logits if hasattr(out, "logits") else out[0]
    worst = {"logits": _rel(logits, logits_ref), "loss": _rel(loss.detach(), _loss(out_ref).detach())}
    wrong = []
    for name, expected in ref_grads.items():
        actual = grads.get(name)
        if expected is None or actual is None:
            if (expected is None) != (actual is None):
                wrong.append((name, float("inf")))
            continue
        err = _rel(actual, expected)
        worst["grads"] = max(worst.get("grads", 0.0), err)
        if err > EXACT_RTOL:
            wrong.append((name, err))
    bad = worst["logits"] > EXACT_RTOL or worst["loss"] > EXACT_RTOL or wrong
    extra = {"worst": {k: float(f"{v:.2e}") for k, v in worst.items()}}
    if bad:
        extra["wrong_grads"] = [f"{n} ({e:.2g})" for n, e in sorted(wrong, key=lambda x: -x[1])[:5]]
        extra["wrong_grads_count"] = len(wrong)
    return ("wrong" if bad else "exact"), extra


class _Never(Exception):
    """Raised by nothing: the checks' error of an older shardcore, which has none."""


def _checked(shardcore) -> type:
    """The error of shardcore's checks (an older shardcore, swept for a before/after count, has none)."""
    return getattr(shardcore, "ShardingCheckError", _Never)


def _uncovered(model) -> bool:
    """Neither a plugin nor a shipped plan covers ``model``."""
    import shardcore

    try:
        shardcore.resolve_policy(model)
    except shardcore.NoPolicyError:
        return True
    return False


def one_family(model_type: str, task: str, class_name: str, *, zero_config: bool = False, derive: bool = False) -> dict:
    """One family on this rank (every rank of the pool calls it): its outcome as a dict.
    ``zero_config``: the plans the config ships even where a plugin covers the family; ``derive``:
    ``ShardConfig(plan="derive")`` for a family neither a plugin nor a shipped plan covers."""
    import torch
    import transformers

    import shardcore
    from shardcore.sharded_state import full_named_tensors

    start = time.perf_counter()
    result = {"family": model_type, "task": task, "model": class_name}

    def done(outcome: str, **extra) -> dict:
        return {**result, "outcome": outcome, **extra, "seconds": round(time.perf_counter() - start, 2)}

    try:
        config = tiny_config(model_type)
        cls = getattr(transformers, class_name)
        batch = _inputs(task, config)
        torch.manual_seed(0)
        ref = cls(config).float().eval()
        out_ref = ref(**batch)
        _loss(out_ref).backward()
        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    except Exception as err:
        return done("cannot build", reason=f"{type(err).__name__}: {str(err)[:300]}")
    try:
        torch.manual_seed(0)
        model = cls(config).float().eval()
        policy = None
        if zero_config:
            from shardcore.plan import zero_config_policy

            policy = zero_config_policy(model)
        plan = "derive" if derive and policy is None and _uncovered(model) else None
        result["derived"] = plan is not None
        model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=2, plan=plan), policy=policy)
    except (shardcore.NoPolicyError, _checked(shardcore), NotImplementedError, ValueError) as err:
        return done("refused", reason=f"{type(err).__name__}: {str(err)[:300]}", at="optimize")
    except Exception as err:
        return done("error", reason=f"{type(err).__name__}: {str(err)[:300]}", at="optimize")
    policy = type(model.shardcore.policy).__name__
    try:
        out = model(**batch)
        loss = _loss(out)
        loss.backward()
        grads = dict(full_named_tensors(model, grads=True))
    except _checked(shardcore) as err:
        return done("refused", reason=f"{type(err).__name__}: {str(err)[:300]}", at="first step", policy=policy)
    except Exception as err:
        return done("error", reason=f"{type(err).__name__}: {traceback.format_exc(limit=-3)[-400:]}", policy=policy)
    outcome, extra = _compare(out_ref, ref_grads, out, loss, grads)
    return done(outcome, policy=policy, **extra)


def reference_check(model_type: str, task: str, class_name: str, limit: float) -> dict | None:
    """In the driver, before any rank: build the family and run it unsharded within ``limit``
    seconds; its "cannot build" outcome, or ``None`` when it builds in time."""
    import signal

    import torch
    import transformers

    start = time.perf_counter()

    def over(signum, frame):
        raise TimeoutError(f"over the time limit of {limit:.0f} s at tiny size")

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        config = tiny_config(model_type)
        torch.manual_seed(0)
        model = getattr(transformers, class_name)(config).float().eval()
        size = sum(p.numel() for p in model.parameters())
        if size > MAX_PARAMS:  # a size the tiny overrides do not reach: two ranks x two copies would not fit
            raise MemoryError(
                f"{size / 1e6:.0f} M parameters at the tiny config (the sweep's limit: {MAX_PARAMS / 1e6:.0f} M)"
            )
        _loss(model(**_inputs(task, config))).backward()
        return None
    except Exception as err:
        reason = f"{type(err).__name__}: {str(err)[:300]}"
        seconds = round(time.perf_counter() - start, 2)
        return {"family": model_type, "task": task, "model": class_name, "outcome": "cannot build", "reason": reason,
                "seconds": seconds}  # fmt: skip
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def table(results: list[dict], version: str) -> str:
    """The counts and the list, as markdown. Families sharded by a derived plan (``--derive``) count
    as refused (no plugin, no plan) in the first row, by their own outcome in the second."""
    order = ["exact", "refused", "cannot build", "error", "wrong"]
    default = [("refused" if r.get("derived") else r["outcome"]) for r in results]
    rows = [("by default", default)]
    if any(r.get("derived") for r in results):
        rows.append(('with plan="derive" where nothing covers a family', [r["outcome"] for r in results]))
    lines = [
        f"# Family sweep: transformers {version}, TP=2, {len(results)} families",
        "",
        "Written by `nox -s families` (`python benchmarks/families.py`); see the script's docstring for the outcomes.",
        "",
        "| | " + " | ".join(order) + " |",
        "|---|" + "---|" * len(order),
        *(f"| {name} | " + " | ".join(str(row.count(o)) for o in order) + " |" for name, row in rows),
        "",
        "| family | task | outcome | policy | worst difference / reason |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        what = r.get("reason") or ", ".join(f"{k} {v}" for k, v in r.get("worst", {}).items())
        what = what.replace("|", "\\|").replace("\n", " ")[:160]
        policy = r.get("policy", "") + (" (derived)" if r.get("derived") else "")
        lines.append(f"| {r['family']} | {r['task']} | {r['outcome']} | {policy} | {what} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model types (default: every family)")
    parser.add_argument("--task", nargs="*", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--derive", action="store_true", help='plan="derive" where no plugin nor plan covers a family')
    parser.add_argument("--limit", type=float, default=60.0, help="seconds a family may take to build and run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "families.json"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the pool's workers import this module by name
    os.environ.setdefault("SHARDCORE_COLLECTIVE_TIMEOUT", "120")  # a family that hangs a collective ends there
    import families as me  # by its importable name: the pool's workers import it
    import transformers

    from shardcore.distributed.launcher import RankError
    from shardcore.testing import close_pools, run_on_ranks

    results = []
    chosen = families(args.task, args.only)
    print(f"{len(chosen)} families, transformers {transformers.__version__}", flush=True)
    try:
        for i, (model_type, task, name) in enumerate(chosen):
            try:
                result = (
                    reference_check(model_type, task, name, args.limit)
                    or run_on_ranks(2, me.one_family, model_type, task, name, derive=args.derive)[0]
                )
            except RankError as err:  # a rank died (the pool is made anew for the next family)
                result = {"family": model_type, "task": task, "model": name, "outcome": "error",
                          "reason": f"RankError: {str(err)[:300]}", "seconds": None}  # fmt: skip
            results.append(result)
            print(f"[{i + 1}/{len(chosen)}] {model_type} {task}: {result['outcome']} "
                  f"({result['seconds']} s) {result.get('reason', result.get('worst', ''))}"[:240], flush=True)  # fmt: skip
    finally:
        close_pools()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"transformers": transformers.__version__, "tp": 2, "families": results}, indent=1) + "\n"
    )
    out.with_suffix(".md").write_text(table(results, transformers.__version__))
    print(table(results, transformers.__version__).split("\n\n")[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
