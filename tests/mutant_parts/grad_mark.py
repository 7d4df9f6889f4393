"""Mutants of grad_mark: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "gradients-unmarked",
        "a sharded model's gradients carry no mark: torch's clip_grad_norm_ clips by this rank's norm",
        "shardcore/grad_mark.py",
        "mark_gradients",
        [
            (
                '    mark_new(model)\n    attached(model).before_forward(model, "grad_mark", mark_new, what="parameters added since marked for the norm")\n',
                "    pass\n",
            )
        ],
        "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
        "a sharded model's gradient without its mark",
    ),
    m(
        "adapters-added-later-unmarked",
        "parameters added after optimize (LoRA) are never marked: torch's norm of their gradients is per rank",
        "shardcore/grad_mark.py",
        "mark_gradients",
        [
            (
                '    attached(model).before_forward(model, "grad_mark", mark_new, what="parameters added since marked for the norm")\n',
                "",
            )
        ],
        "tests/integration/test_llama_peft.py::test_lora_matches_unsharded_peft_model[optimize-then-lora-2]",
        "torch's norm of the LoRA gradients is not the unsharded one",
    ),
    m(
        "marked-results-propagate",
        "the mark spreads to every tensor computed from a gradient (optimizer state: saved as shardcore's class)",
        "shardcore/grad_mark.py",
        "",
        [
            (
                "        return _on_gradient(func, args, kwargs or {})\n\n\n@functools.cache",
                "        if func not in (torch.linalg.vector_norm, torch._foreach_norm, torch.Tensor.__deepcopy__, torch.Tensor.__reduce_ex__):\n            return super().__torch_function__(func, types, args, kwargs)\n        return _on_gradient(func, args, kwargs or {})\n\n\n@functools.cache",
            )
        ],
        "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
        "optimizer state made from a marked gradient",
    ),
    m(
        "fsdp-gradients-unmarked",
        "FSDP's DTensor gradients are left unmarked: torch's norm counts only the data-parallel shards",
        "shardcore/grad_mark.py",
        "_mark",
        [("    elif type(grad) is _dtensor():", "    elif False:")],
        "tests/integration/test_llama_clipping.py::test_layouts[fsdp2xtp2]",
        "clip_grad_norm_ (torch, norm_type=2) on rank",
    ),
    m(
        "mixed-norms-not-refused",
        "a sharded model's gradients stacked with another tensor's norm are summed as if all were the model's",
        "shardcore/grad_mark.py",
        "_stacked",
        [("    others = len(tensors) - len(parts) + sum(p._others for p in parts)", "    others = 0")],
        "tests/integration/test_llama_clipping.py::test_gradients_mixed_with_other_tensors_are_refused_on_every_rank",
        "mixed gradients were not refused",
    ),
    m(
        "norm-part-not-reduced",
        "torch's total of marked gradients is taken from this rank's values (no shardcore grad_norm)",
        "shardcore/grad_mark.py",
        "_total",
        [
            (
                "    return like_grads(grad_norm(model, params, order), grads)",
                "    return _plain(torch.linalg.vector_norm, args, kwargs)",
            )
        ],
        "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
        "torch's norm of marked gradients is not the unsharded one",
    ),
    m(
        "zero-bubble-gradients-unmarked",
        "a zero-bubble schedule's weight gradients (set by torch's stage, no autograd hook) are left unmarked",
        "shardcore/grad_mark.py",
        "mark_gradients",
        [("        pipeline.after_step.append(_mark_all)\n", "        pass\n")],
        "tests/integration/test_llama_clipping.py::test_zero_bubble_schedule",
        "together with",
    ),
    m(
        "kept-norm-holds-its-gradient",
        "a gradient's norm kept for logging keeps the whole gradient alive",
        "shardcore/grad_mark.py",
        "NormPart.of",
        [
            (
                "        part._order, part._others = order, others\n",
                "        part._order, part._others, part._keep = order, others, grads\n",
            )
        ],
        "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
        "a norm kept for logging holds its gradient",
    ),
    m(
        "marked-gradient-copied-marked",
        "copy.deepcopy / torch.save of a marked gradient go through the mark (the copy fails, the file needs shardcore)",
        "shardcore/grad_mark.py",
        "_on_gradient",
        [
            (
                "    if func in (torch.Tensor.__deepcopy__, torch.Tensor.__reduce_ex__) and _marked(args[0]):",
                "    if False:",
            )
        ],
        "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
        "__deepcopy__() for non-wrapper subclasses",
    ),
    m(
        "norm-of-norms-order-ignored",
        "a norm of the gradients' 2-norms taken in another order is answered with shardcore's norm of that order",
        "shardcore/grad_mark.py",
        "_total",
        [("    if order != part._order or any(g is None for g in grads):", "    if any(g is None for g in grads):")],
        "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
        "a norm of norms of another order is not torch's",
    ),
    m(
        "dtensor-imported-with-shardcore",
        "grad_mark imports DTensor with shardcore (about a second of every start) instead of at its first use",
        "shardcore/grad_mark.py",
        "",
        [("import functools\n", "import functools\n\nfrom torch.distributed.tensor import DTensor  # noqa: F401\n")],
        "tests/test_core_plugins.py::test_import_and_discovery_do_not_import_model_libraries",
        "imported by a fresh import of shardcore: torch.distributed.tensor",
    ),
]
