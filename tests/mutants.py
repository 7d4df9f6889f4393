"""Mutation testing of the conformance kit: deliberate bugs in the core, the plugins and the kit
itself, each of which one declared check must catch (``nox -s mutants``; CI runs the ``fast`` ones).

Each mutant replaces snippets of one source file (each snippet must occur exactly once, so a
mutant that no longer applies is an error, not a silent pass: ``tests/test_core_mutants.py``
checks that in CI), in a scratch copy of the repository, and runs the ONE test it declares with
the copy first on ``PYTHONPATH``. A mutant is *caught* only when that test fails and its failure
report (the exception's text, asserts run plain, no line of source: ``tests/mutant_report.py``)
holds the declared message fragment, a fragment specific to that failure (:func:`vague`; each
mutant's (test, message) pair its own); any other failure (an error elsewhere, a crash with
another message, the message only in the test's code), a time-out or a hang is *not caught* and
reported as such. The unmutated copy
must pass the same tests first. The full run writes ``docs/mutants.json`` (committed, the score
in docs/plugins.md); ``--fast`` writes ``bench-results/mutants-fast.json``.

    python tests/mutants.py [--fast] [NAME ...]     # all mutants, the fast ones, or the named ones
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
LLAMA = "plugins/shard-llama/tests"
#: a hang inside a test (the rank pool's call time-out is 330 s) ends here first: not caught
TIMEOUT_S = 240


@dataclass(frozen=True)
class Mutant:
    """One deliberate bug: ``edits`` (snippet, replacement) applied to ``file``; ``test`` (a pytest
    node id) must fail with ``expect`` in its output."""

    name: str
    bug: str
    file: str
    edits: tuple[tuple[str, str], ...]
    test: str
    expect: str
    fast: bool = False  # in CI's subset


def _m(name, bug, file, edits, test, expect, fast=False) -> Mutant:
    edits = (edits,) if isinstance(edits[0], str) else edits
    return Mutant(name, bug, file, tuple(edits), test, expect, fast)


POLICY = "plugins/shard-llama/shard_llama/policy.py"
SPEC = "tests/test_core_spec.py"

MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        # -- tensor parallelism -------------------------------------------------------------------
        _m(
            "policy-replaces-nothing",
            "a policy that replaces nothing (Llama's module_policy returns {})",
            POLICY,
            (
                "        heads, kv, head_dim = self._dims()\n",
                "        return {}\n        heads, kv, head_dim = self._dims()\n",
            ),
            f"{LLAMA}/test_llama_tp.py::test_causal_lm[2]",
            "hold no parallel module: the policy left them whole",
            fast=True,
        ),
        _m(
            "no-replica-grad-sync",
            "replicated KV heads' gradients not summed over their replicas (_SyncReplicaGrads skipped)",
            "shardcore/tensor_parallel/linear.py",
            ("        if self._replica_groups is not None and torch.is_grad_enabled():", "        if False:"),
            f"{LLAMA}/test_llama_tp.py::test_causal_lm_variants[gqa-4]",
            "gradient of model.layers.0.self_attn.k_proj.weight (gathered): relative error",
        ),
        _m(
            "copy-to-tp-backward-dropped",
            "Megatron's f without its backward all-reduce: input gradients stay partial",
            "shardcore/tensor_parallel/mappings.py",
            (
                "        return all_reduce(grad.contiguous().clone(), ctx.group, where=ctx.where), None",
                "        return grad, None",
            ),
            "tests/test_core_toy.py::test_toy_model_matches_unsharded[128-2]",
            "gradient of embed.weight (gathered): relative error 0.7",
            fast=True,
        ),
        _m(
            "copy-to-tp-backward-scaled",
            "copy_to_tp's backward all-reduce scaled by the group size",
            "shardcore/tensor_parallel/mappings.py",
            (
                "        return all_reduce(grad.contiguous().clone(), ctx.group, where=ctx.where), None",
                "        return all_reduce(grad.contiguous().clone(), ctx.group, where=ctx.where) * group_size(ctx.group), None",
            ),
            "tests/test_core_toy.py::test_toy_model_matches_unsharded[128-2]",
            "gradient of embed.weight (gathered): relative error 11 > 0.0001",
        ),
        _m(
            "mapping-breaks-the-graph",
            "copy_to_tp kept out of torch.compile again: a compiled tensor-parallel block breaks at each region entry",
            "shardcore/tensor_parallel/mappings.py",
            ("def copy_to_tp(", "@torch.compiler.disable\ndef copy_to_tp("),
            "tests/test_core_compile.py::test_a_compiled_tensor_parallel_block_is_one_graph_with_its_collectives_in_it",
            "torch._dynamo.exc.Unsupported",
        ),
        _m(
            "traced-reduce-takes-the-max",
            "the compiled all-reduce takes the largest partial sum instead of adding them: a compiled row-parallel layer is wrong",
            "shardcore/distributed/traced.py",
            ('funcol.all_reduce(x, "sum", group)', 'funcol.all_reduce(x, "max", group)'),
            "tests/test_core_compile.py::test_a_compiled_tensor_parallel_block_is_one_graph_with_its_collectives_in_it",
            "the compiled block's output differs from the eager one's",
        ),
        _m(
            "traced-backward-reduce-skipped",
            "in a compiled graph Megatron's f keeps its gradient partial (no backward all-reduce)",
            "shardcore/tensor_parallel/mappings.py",
            ("            return traced.all_reduce(grad, ctx.group), None", "            return grad, None"),
            "tests/test_core_compile.py::test_a_compiled_tensor_parallel_block_is_one_graph_with_its_collectives_in_it",
            "the compiled block's gradients differ from the eager one's",
        ),
        _m(
            "gradients-unmarked",
            "a sharded model's gradients carry no mark: torch's clip_grad_norm_ clips by this rank's norm",
            "shardcore/grad_mark.py",
            (
                "    mark_new(model)\n    # first among the pre-hooks: before FSDP's swaps the root's sharded parameters for"
                " unsharded ones\n    handles.append(model.register_forward_pre_hook(mark_new, prepend=True))\n",
                "    pass\n",
            ),
            "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
            "a sharded model's gradient without its mark",
        ),
        _m(
            "adapters-added-later-unmarked",
            "parameters added after optimize (LoRA) are never marked: torch's norm of their gradients is per rank",
            "shardcore/grad_mark.py",
            ("    handles.append(model.register_forward_pre_hook(mark_new, prepend=True))\n", ""),
            f"{LLAMA}/test_llama_peft.py::test_lora_matches_unsharded_peft_model[optimize-then-lora-2]",
            "torch's norm of the LoRA gradients is not the unsharded one",
        ),
        _m(
            "marked-results-propagate",
            "the mark spreads to every tensor computed from a gradient (optimizer state: saved as shardcore's class)",
            "shardcore/grad_mark.py",
            (
                "        return _on_gradient(func, args, kwargs or {})\n\n\nclass ShardDTensorGrad",
                "        if func not in (torch.linalg.vector_norm, torch._foreach_norm,"
                " torch.Tensor.__deepcopy__, torch.Tensor.__reduce_ex__):\n"
                "            return super().__torch_function__(func, types, args, kwargs)\n"
                "        return _on_gradient(func, args, kwargs or {})\n\n\nclass ShardDTensorGrad",
            ),
            "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
            "optimizer state made from a marked gradient",
        ),
        _m(
            "fsdp-gradients-unmarked",
            "FSDP's DTensor gradients are left unmarked: torch's norm counts only the data-parallel shards",
            "shardcore/grad_mark.py",
            ("    elif type(grad) is DTensor:", "    elif False:"),
            f"{LLAMA}/test_llama_clipping.py::test_layouts[fsdp2xtp2]",
            "clip_grad_norm_ (torch, norm_type=2) on rank",
        ),
        _m(
            "mixed-norms-not-refused",
            "a sharded model's gradients stacked with another tensor's norm are summed as if all were the model's",
            "shardcore/grad_mark.py",
            ("    others = len(tensors) - len(parts) + sum(p._others for p in parts)", "    others = 0"),
            f"{LLAMA}/test_llama_clipping.py::test_gradients_mixed_with_other_tensors_are_refused_on_every_rank",
            "mixed gradients were not refused",
        ),
        _m(
            "norm-part-not-reduced",
            "torch's total of marked gradients is taken from this rank's values (no shardcore grad_norm)",
            "shardcore/grad_mark.py",
            (
                "    return like_grads(grad_norm(model, params, order), grads)",
                "    return _plain(torch.linalg.vector_norm, args, kwargs)",
            ),
            "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
            "torch's norm of marked gradients is not the unsharded one",
        ),
        _m(
            "zero-bubble-gradients-unmarked",
            "a zero-bubble schedule's weight gradients (set by torch's stage, no autograd hook) are left unmarked",
            "shardcore/grad_mark.py",
            ("        pipeline.after_step.append(_mark_all)\n", "        pass\n"),
            f"{LLAMA}/test_llama_clipping.py::test_zero_bubble_schedule",
            "together with",
        ),
        _m(
            "kept-norm-holds-its-gradient",
            "a gradient's norm kept for logging keeps the whole gradient alive",
            "shardcore/grad_mark.py",
            (
                "        part._order, part._others = order, others\n",
                "        part._order, part._others, part._keep = order, others, grads\n",
            ),
            "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
            "a norm kept for logging holds its gradient",
        ),
        _m(
            "marked-gradient-copied-marked",
            "copy.deepcopy / torch.save of a marked gradient go through the mark (the copy fails, the file needs shardcore)",
            "shardcore/grad_mark.py",
            (
                "    if func in (torch.Tensor.__deepcopy__, torch.Tensor.__reduce_ex__) and isinstance(args[0], _MARKED):",
                "    if False:",
            ),
            "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
            "__deepcopy__() for non-wrapper subclasses",
        ),
        _m(
            "norm-of-norms-order-ignored",
            "a norm of the gradients' 2-norms taken in another order is answered with shardcore's norm of that order",
            "shardcore/grad_mark.py",
            (
                "    if order != part._order or any(g is None for g in grads):",
                "    if any(g is None for g in grads):",
            ),
            "tests/test_core_seams.py::test_torch_s_own_norm_is_never_replaced",
            "a norm of norms of another order is not torch's",
        ),
        _m(
            "groups-keep-nccl-s-default-timeout",
            "the groups shardcore creates on NCCL keep NCCL's 10-minute timeout, not twice the model's bound",
            "shardcore/distributed/groups.py",
            (
                "    return dist.new_group(ranks, timeout=group_timeout())",
                "    return dist.new_group(ranks)",
            ),
            "tests/test_core_devices.py::test_the_groups_shardcore_creates_on_nccl_wait_twice_the_bound[nccl-14.0]",
            "the group's timeout",
        ),
        _m(
            "mesh-groups-keep-nccl-s-default-timeout",
            "the layout's device mesh is built without the timeout in NCCL's options",
            "shardcore/distributed/groups.py",
            ("        options._timeout = timeout\n", ""),
            "tests/test_core_devices.py::test_the_groups_shardcore_creates_on_nccl_wait_twice_the_bound[cpu:gloo,cuda:nccl-14.0]",
            "the mesh's groups would not wait twice the bound",
        ),
        _m(
            "cpu-mesh-under-cpu-gloo-cuda-nccl",
            "the layout's mesh is a CPU mesh under init_from_env's cpu:gloo,cuda:nccl (FSDP2 would keep shards on the CPU)",
            "shardcore/distributed/groups.py",
            ('"nccl" in backends().values() and torch.cuda.is_available()', 'dist.get_backend() == "nccl"'),
            "tests/test_core_devices.py::test_the_meshes_shardcore_builds_are_on_the_gpu_when_the_world_runs_nccl[cpu:gloo,cuda:nccl-cuda]",
            "a cpu mesh on a world running cpu:gloo,cuda:nccl",
        ),
        _m(
            "flight-recorder-overrides-the-user",
            "shardcore's flight-recorder defaults overwrite the NCCL variables the user set",
            "shardcore/distributed/watch.py",
            ("        os.environ.setdefault(name, value)", "        os.environ[name] = value"),
            "tests/test_core_devices.py::test_the_group_shardcore_starts_on_a_gpu_has_nccl_s_flight_recorder_on[True]",
            "the flight recorder's variables when NCCL starts",
        ),
        _m(
            "sequence-region-drops-the-last-block",
            "the default split_gather region leaves a model's last block out: it runs on the whole sequence, unsplit",
            "shardcore/sequence/hooks.py",
            ("        return [self.blocks()]", "        return [self.blocks()[:-1]]"),
            f"{LLAMA}/test_llama_sequence.py::test_the_sequence_is_split_and_an_odd_length_runs_unsplit",
            "not every block's two regions ran sequence-split",
        ),
        _m(
            "moved-attention-names-unwarned",
            "the attention names moved out of shardcore.kernels resolve silently: plugins get no warning before 0.3 drops them",
            "shardcore/moved.py",
            ("        warnings.warn(\n", "        (lambda *a, **k: None)(\n"),
            "tests/test_core_moved_imports.py::test_the_attention_registry_s_old_names_in_kernels_warn_and_are_the_new_code",
            "the moved attention names did not each warn naming their new module",
        ),
        _m(
            "moved-attention-name-dropped",
            "an attention name moved out of shardcore.kernels no longer resolves there: a 0.1 plugin breaks before 0.3",
            "shardcore/kernels.py",
            ('    "hf_sdpa_name",\n', ""),
            "tests/test_core_moved_imports.py::test_the_attention_registry_s_old_names_in_kernels_warn_and_are_the_new_code",
            "has no attribute 'hf_sdpa_name'",
        ),
        _m(
            "deferred-gather-returns-the-slice",
            "with the loss computed on the slices, the causal LM's output keeps this rank's vocabulary slice, not the gathered logits",
            "shardcore/integrations/hf/causal_lm_loss.py",
            ("    output[at] = full\n", "    output[at] = value\n"),
            f"{LLAMA}/test_llama_tp.py::test_causal_lm[2]",
            "output 'logits': shape (2, 12, 64) != unsharded (2, 12, 128)",
        ),
        _m(
            "moved-loss-name-dropped",
            "a loss-glue name moved out of shardcore.losses no longer resolves there: a 0.1 plugin breaks before 0.3",
            "shardcore/losses.py",
            ('_MOVED = ("defer_logits_gather", "loss_on_head_slices")', '_MOVED = ("defer_logits_gather",)'),
            "tests/test_core_moved_imports.py::test_the_causal_lm_loss_glue_s_old_names_in_losses_warn_and_are_the_new_code",
            "has no attribute 'loss_on_head_slices'",
        ),
        _m(
            "expert-groups-not-prepared",
            "optimize no longer builds the expert-parallel groups before the layers: an expert layer would have to create them itself",
            "shardcore/optimize.py",
            ("    if b.expert_parallel:  # the expert layers' groups", "    if False:  # the expert layers' groups"),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_each_rank_holds_its_share_of_the_experts[2-2-1]",
            "the expert-parallel groups of layout",
        ),
        _m(
            "row-parallel-split-on-output-dim",
            "a row-parallel layer holding a slice of its output features (rows) instead of its input features",
            "shardcore/tensor_parallel/linear.py",
            (
                '        self._shard_param("weight", weight, spec)\n        self._shard_param("bias", bias, None)\n',
                '        self._shard_param("weight", weight, spec)\n        self._shard_param("bias", bias, None)\n'
                "        self.weight.data = weight.detach().chunk(self.tp_size, 1 - in_dim)[self.tp_rank].contiguous()\n",
            ),
            "tests/test_core_toy.py::test_toy_model_matches_unsharded[128-2]",
            "blocks.0.proj.weight: this rank's tensor is not its slice",
        ),
        _m(
            "qkv-order-permuted",
            "q/k/v parts permuted in FusedLinear1D_Col (rank holds [v; k; q] rows)",
            "shardcore/tensor_parallel/linear.py",
            (
                "        return cls(weight, bias, spec, process_group, copy_input=copy_input)",
                "        weight = torch.cat(weight.detach().chunk(3, dim=1 if cls.transposed else 0)[::-1], 1 if cls.transposed else 0)\n"
                "        return cls(weight, bias, spec, process_group, copy_input=copy_input)",
            ),
            "tests/test_core_toy.py::test_toy_model_matches_unsharded[128-2]",
            "blocks.0.qkv.weight: this rank's tensor is not its slice",
        ),
        _m(
            "tied-weight-untied",
            "a tied weight left untied after sharding (the sharder's retie skipped)",
            "shardcore/sharder.py",
            ("        for places in shared:\n", "        for places in shared[:0]:\n"),
            f"{LLAMA}/test_llama_tp.py::test_causal_lm_variants[tied-2]",
            "parameters differ",
        ),
        _m(
            "vocab-padding-leaks",
            "vocab padding columns leak into vocab-parallel logits (LM head keeps its padded slice)",
            "shardcore/tensor_parallel/embedding.py",
            ("        local = logits[..., : self.vocab_end - self.vocab_start]\n", "        local = logits\n"),
            f"{LLAMA}/test_llama_tp.py::test_parallel_output_vocab_parallel_loss[vocab1001-2]",
            "vs unsharded",
        ),
        _m(
            "smallest-gradient-sign-flip",
            "the sign of the model's smallest gradient flipped (Llama layer 1's post_attention_layernorm)",
            POLICY,
            (
                '                per_rank_rng=["self_attn"],  # attention dropout drops this rank\'s heads\n',
                '                per_rank_rng=["self_attn"],  # attention dropout drops this rank\'s heads\n'
                "                param_replacement=[lambda m: m.post_attention_layernorm.weight.register_hook(lambda g: -g) "
                "if m.self_attn.layer_idx == 1 else None],\n",
            ),
            f"{LLAMA}/test_llama_tp.py::test_causal_lm[2]",
            "gradient of model.layers.1.post_attention_layernorm.weight",
        ),
        _m(
            "whisper-decoder-left-whole",
            "Whisper's structural probe finds the encoder layers only (the decoder stays whole)",
            "plugins/shard-whisper/shard_whisper/policy.py",
            (
                '    return hasattr(module, "self_attn") and hasattr(module, "fc1")',
                '    return hasattr(module, "self_attn") and hasattr(module, "fc1") and not hasattr(module, "encoder_attn")',
            ),
            "plugins/shard-whisper/tests/test_whisper_tp.py::test_whisper_classes[WhisperModel-2]",
            "of the unsharded parameter bytes, >",
        ),
        # -- random streams -----------------------------------------------------------------------
        _m(
            "attention-dropout-shared-stream",
            "attention dropout on the shared random stream (every rank drops the same positions of its heads)",
            "shardcore/tensor_parallel/rng.py",
            ("    _wrap(module, lambda device: fork_tp_rng(group, device))", "    _wrap(module, _shared_stream)"),
            "plugins/shard-bert/tests/test_bert_dropout.py::test_attention_dropout_uses_the_per_rank_stream",
            "a training forward left the tensor-parallel random stream where it was",
        ),
        _m(
            "tp-rng-without-rank",
            "fork_tp_rng seeded without the tensor-parallel rank (every rank draws the same masks)",
            "shardcore/tensor_parallel/rng.py",
            (
                "        seed = key[2] + SEED_OFFSET + group_rank(group)",
                "        seed = key[2] + SEED_OFFSET",
            ),
            "plugins/shard-bert/tests/test_bert_dropout.py::test_per_rank_stream",
            "ranks must drop different heads",
        ),
        _m(
            "residual-dropout-per-rank",
            "GPT-2's residual dropout inside attention left on the per-rank stream (shared_rng dropped)",
            "plugins/shard-gpt2/shard_gpt2/policy.py",
            ('shared_rng=["attn.resid_dropout"],', "shared_rng=[],"),
            "plugins/shard-gpt2/tests/test_gpt2_tp.py::test_dropout_keeps_replicas_in_step",
            "the replicated hidden states differ between ranks",
        ),
        # -- refusals and checkpoints -------------------------------------------------------------
        _m(
            "error-after-collective",
            "the policy's checks moved behind the same-weights all-gather: one rank's error leaves the others waiting",
            "shardcore/optimize.py",
            (
                ("    policy.config_sanity_check()\n", ""),
                (
                    "        check_same_weights(b.model, dist.group.WORLD if b.whole_world else _tp_group(b))\n",
                    "        check_same_weights(b.model, dist.group.WORLD if b.whole_world else _tp_group(b))\n        b.policy.config_sanity_check()\n",
                ),
            ),
            "tests/test_core_config.py::test_bad_input_fails_on_every_rank_without_hanging",
            "refused only after {'new_group'",
        ),
        _m(
            "dcp-wrong-rows",
            "load_distributed assembling a rank's slice with its rows reversed",
            "shardcore/checkpoint/dcp.py",
            (
                "    return torch.cat(pieces, dim=spec.dim)\n",
                "    return torch.cat(pieces, dim=spec.dim).flip(spec.dim)\n",
            ),
            "tests/test_core_dcp.py::test_save_at_tp2_resume_at_other_tp[4]",
            "after resuming: max abs diff",
        ),
        _m(
            "kv-replica-slice-on-hf-load",
            "load_checkpoint reading a replicated KV head for rank r as head r % heads (interleaved) "
            "instead of r // replicas (blocked, as the layers hold it)",
            "shardcore/checkpoint/safetensors_io.py",
            (
                "        ranges = spec.ranges(rank)\n",
                "        n = spec.segments[0].num_shards\n"
                "        ranges = spec.ranges((rank % n) * (spec.tp_size // n) if spec.is_replicated else rank)\n",
            ),
            f"{LLAMA}/test_llama_checkpoint.py::test_meta_load_then_save_round_trip[4]",
            "after lazy load: max abs diff",
        ),
        _m(
            "save-gathers-rows-reversed",
            "save_checkpoint (behind save_pretrained) writing a split tensor's rows in reverse",
            "shardcore/checkpoint/hf_save.py",
            (
                "                full = local if spec is None else spec.gather(local, pg)",
                "                full = local if spec is None else spec.gather(local, pg).flip(0)",
            ),
            f"{LLAMA}/test_llama_save_pretrained.py::test_save_pretrained_loads_unsharded[tp2]",
            "loaded from save_pretrained differs from the unsharded model",
        ),
        # -- the user's own loop ------------------------------------------------------------------
        _m(
            "clip-norm-per-rank",
            "the gradient norm left per rank (no sum over the model's ranks)",
            "shardcore/grad_norm.py",
            (
                "        for g in _replica_groups(info, group, main=i == 0):",
                "        for g in _replica_groups(info, group, main=i == 0)[:0]:",
            ),
            f"{LLAMA}/test_llama_clipping.py::test_torch_clip_grad_norm_is_the_unsharded_norm[2]",
            "clip_grad_norm_ (torch, norm_type=2) on rank",
            fast=True,
        ),
        _m(
            "clip-replicas-counted-as-slices",
            "replicated KV rows and padding rows counted like split rows in the gradient norm",
            "shardcore/grad_norm.py",
            ("    if not spec.is_replicated and not any(pad for _, _, pad in ranges):", "    if True:"),
            f"{LLAMA}/test_llama_clipping.py::test_other_norms[1.0]",
            "clip_grad_norm_ (torch, norm_type=1) on rank",
        ),
        _m(
            "lora-a-gradient-not-summed",
            "a column layer's replicated LoRA A keeps its partial gradient (no all-reduce)",
            "shardcore/integrations/hf/peft.py",
            (
                '    a.weight.register_hook(summed_over(group, f"backward of {where}.lora_A (replicated, partial gradients)"))\n',
                "",
            ),
            f"{LLAMA}/test_llama_peft.py::test_lora_matches_unsharded_peft_model[lora-then-optimize-2]",
            "lora_A.default.weight",
            fast=True,
        ),
        _m(
            "lora-cut-only-at-forward",
            "adapters peft adds after optimize cut only at the next forward (no registration hook)",
            "shardcore/optimize.py",
            ("        watch_adapters(model)\n", ""),
            f"{LLAMA}/test_llama_peft.py::test_merge_and_unload_before_any_forward",
            "_merge_before_forward failed on 2 of 2 ranks",
            fast=True,
        ),
        _m(
            "trainer-batches-over-world",
            "shardcore.hf.Trainer sharding batches over every process instead of the dp dim",
            "shardcore/integrations/hf/trainer.py",
            (
                "            num_processes=self._dp_size,\n            process_index=self._dp_rank,\n",
                "            num_processes=acc.num_processes,\n            process_index=acc.process_index,\n",
            ),
            f"{LLAMA}/test_llama_trainer.py::test_trains_like_one_process_trainer[tp2]",
            "InputMismatch",
        ),
        _m(
            "trainer-eval-gathered-over-world",
            "shardcore.hf.Trainer's evaluation gathering predictions over every process (once per TP rank)",
            "shardcore/integrations/hf/trainer.py",
            (
                "        accelerator.gather_for_metrics = self._gather_for_metrics\n"
                "        self.gather_function = self._gather_for_metrics  # the Trainer bound the original already\n",
                "",
            ),
            f"{LLAMA}/test_llama_trainer.py::test_evaluate_and_predict_like_one_process[tp2]",
            "torch.Size([12, 12, 128])",
        ),
        _m(
            "accelerate-ddp-overwrites-slices",
            "a sharded model without its DDP ignore list: accelerate's prepare broadcasts rank 0's slices",
            "shardcore/optimize.py",
            ("        b.model._ddp_params_and_buffers_to_ignore = sorted(parameter_specs(b.model))", "        pass"),
            f"{LLAMA}/test_llama_trainer.py::test_accelerate_prepare_is_right_or_loud",
            "max_abs_diff_weights",
        ),
        # -- sequence, pipeline, data parallelism -------------------------------------------------
        _m(
            "sp-replicated-grads-not-summed",
            "split_gather: replicated parameters' gradients (norms) not summed over the sequence split",
            "shardcore/sequence/split_gather.py",
            (
                "                if partial:\n                    _sum_grads_when_split",
                "                if False:\n                    _sum_grads_when_split",
            ),
            f"{LLAMA}/test_llama_sequence.py::test_split_gather_matches_unsharded[causal-tp2]",
            "gradient of model.layers.0.input_layernorm.weight (gathered): relative error",
            fast=True,
        ),
        _m(
            "ulysses-backward-swapped",
            "Ulysses: the backward exchange with scatter and gather swapped (reshaped to fit, "
            "as one silences autograd's shape check)",
            "shardcore/sequence/ulysses.py",
            (
                (
                    "        ctx.group, ctx.scatter, ctx.gather = group, scatter, gather\n",
                    "        ctx.group, ctx.scatter, ctx.gather, ctx.shape = group, scatter, gather, x.shape\n",
                ),
                (
                    '            all_to_all_cat(grad, ctx.group, ctx.gather, ctx.scatter, where="backward of Ulysses attention"),',
                    "            all_to_all_cat(grad, ctx.group, ctx.scatter, ctx.gather).reshape(ctx.shape),",
                ),
            ),
            f"{LLAMA}/test_llama_sequence.py::test_all_to_all_matches_unsharded[seqcls-gqa-sp2]",
            "gradient of model.embed_tokens.weight (gathered): relative error",
        ),
        _m(
            "ring-mask-offset",
            "ring_attn: every rank masks its queries as if it held the first chunks (mask offset lost)",
            "shardcore/sequence/ring.py",
            ("        mine = positions[group_rank(group)]", "        mine = positions[0]"),
            f"{LLAMA}/test_llama_sequence.py::test_ring_attn_matches_unsharded[gqa-padded-sp2]",
            "output 'logits': max abs diff",
        ),
        _m(
            "pipeline-microbatch-loss-dropped",
            "pipeline: the first microbatch's loss left out of the whole batch's loss",
            "shardcore/pipeline/runtime.py",
            ("for x in losses]).sum() if losses", "for x in losses[1:]]).sum() if losses"),
            f"{LLAMA}/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[gpipe]",
            "pipeline_step loss 3.546",
        ),
        _m(
            "pipeline-scale-grads",
            "pipeline: torch's schedule left to divide the gradients by the number of microbatches again",
            "shardcore/pipeline/runtime.py",
            ('        kwargs["scale_grads"] = False', '        kwargs["scale_grads"] = True'),
            f"{LLAMA}/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[1f1b-layers13]",
            "gradient of model.embed_tokens.weight (held, gathered over tp): relative error 0.75",
        ),
        _m(
            "pipeline-padding-counted",
            "pipeline: a causal LM's microbatch losses divided by every label position, ignored (-100) ones included",
            "shardcore/integrations/hf/stages.py",
            (
                "            return (labels[..., 1:] != -100).sum()  #",
                "            return labels[..., 1:].numel()  #",
            ),
            f"{LLAMA}/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[gpipe]",
            "pipeline_step loss 3.741",
        ),
        _m(
            "pipeline-tied-sum-dropped",
            "pipeline: the tied embedding's gradient not summed over the first and last stage",
            "shardcore/pipeline/runtime.py",
            ("    for name, group in info.tied:  #", "    for name, group in info.tied[:0]:  #"),
            f"{LLAMA}/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[gpipe]",
            "gradient of lm_head.weight (held, gathered over tp): relative error",
            fast=True,
        ),
        _m(
            "fsdp-block-skipped",
            "FSDP: fully_shard skipped on the first block (its weights stay whole on every dp rank)",
            "shardcore/data_parallel/__init__.py",
            ("            for block in blocks:\n", "            for block in blocks[1:]:\n"),
            f"{LLAMA}/test_llama_data_parallel.py::test_trains_like_unsharded_full_batch[fsdp2xtp2]",
            "are not wrapped by fully_shard",
        ),
        # -- the core's own mechanisms --------------------------------------------------------------
        _m(
            "reduce-in-place-unasked",
            "reduce_from_tp sums any contiguous input in place, also one the caller still holds",
            "shardcore/tensor_parallel/mappings.py",
            ("        if fresh and x.is_contiguous():", "        if x.is_contiguous():"),
            "tests/test_core_layers.py::test_reduce_from_tp_sums_in_place_only_a_fresh_partial_sum",
            "_reduce_leaves_its_input failed",
        ),
        _m(
            "replica-groups-not-prepared",
            "optimize no longer makes the replica sub-groups before the layers are built",
            "shardcore/optimize.py",
            ("    prepare_replica_groups(b.group, tp_groups)\n", ""),
            f"{LLAMA}/test_llama_tp.py::test_causal_lm_variants[gqa-4]",
            "are not prepared: call shardcore.distributed.prepare_replica_groups",
        ),
        _m(
            "init-empty-every-thread",
            "init_empty moves the parameters of every thread to meta, not only its own",
            "shardcore/meta.py",
            (" or threading.get_ident() != thread:", ":"),
            "tests/test_core_checkpoint.py::test_init_empty_touches_nothing_outside_its_block_and_thread",
            "init_empty moved another thread's new parameters to meta",
            fast=True,
        ),
        _m(
            "counts-not-per-model",
            "collectives counted for the process only, not for the model that issued them",
            "shardcore/distributed/scope.py",
            ("    if scope is not DEFAULT_SCOPE:\n", "    if False:\n"),
            "tests/test_core_consistency.py::test_each_model_counts_its_own_collectives",
            "_counts_per_model failed",
        ),
        _m(
            "backward-bound-of-the-process",
            "a backward collective waits with the bound of whatever runs now, not of the model that recorded it",
            "shardcore/distributed/collectives.py",
            (
                "    scope = _scope(where)\n    where = where or",
                "    scope = current_scope()\n    where = where or",
            ),
            "tests/test_core_consistency.py::test_a_collective_only_some_ranks_call_raises_within_the_bound"
            "[backward-later-model-False-(backward of ]",
            "waited more than 300 s",
        ),
        _m(
            "sp-swaps-registered-parameters",
            "sequence parallelism puts the gradient-summing copy of a norm weight into the parameter registry mid-forward",
            "shardcore/sequence/split_gather.py",
            ("            mod.__dict__[n] = copy_to_tp(", "            mod._parameters[n] = copy_to_tp("),
            f"{LLAMA}/test_llama_sequence.py::test_a_split_forward_never_swaps_registered_parameters",
            "_registry_mid_forward failed",
        ),
        _m(
            "recompute-draws-unchecked",
            "a checkpointed block's recompute draws other per-rank dropout masks than its forward, unnoticed",
            "shardcore/tensor_parallel/rng.py",
            ("        raise RuntimeError(RECOMPUTE_DRAWS)\n", "        pass\n"),
            "plugins/shard-bert/tests/test_bert_dropout.py::test_a_checkpoint_shardcore_does_not_see_is_refused",
            "a checkpoint shardcore does not see ran unrefused",
        ),
        _m(
            "recompute-streams-not-replayed",
            "HF gradient checkpointing recomputes per-rank dropout from the live streams, not the forward's",
            "shardcore/tensor_parallel/rng.py",
            ("        _STATES.update(token)\n", "        _STATES.update(live)\n"),
            "plugins/shard-bert/tests/test_bert_dropout.py::test_gradient_checkpointing_is_exact",
            "checkpointed gradients off by",
        ),
        _m(
            "recompute-split-state-lost",
            "a block recomputed under sequence parallelism runs as if its forward had not been split "
            "(its 6 tokens against the 12 positions of the whole sequence)",
            "shardcore/tensor_parallel/regions.py",
            (
                "        (self.active, self.attention_calls), self.checkpointing = token, True\n",
                "        (self.active, self.attention_calls), self.checkpointing = (False, 0), True\n",
            ),
            "plugins/shard-llama/tests/test_llama_sequence.py::test_gradient_checkpointing_matches_unsharded",
            "must match the size of tensor b (12)",
        ),
        _m(
            "nccl-wait-blocks-host",
            "on NCCL every collective is waited for with a timeout again: a host sync per all-reduce",
            "shardcore/distributed/collectives.py",
            (
                "        work.wait()  # a stream wait: with a timeout NCCL would block the host until it finishes",
                "        work.wait(timeout=timedelta(seconds=bound))",
            ),
            f"{LLAMA}/test_llama_sync_audit.py::test_a_steady_training_step_makes_no_host_sync[default]",
            "'wait(timeout)', 'shardcore/distributed/collectives.py', '_wait_on_stream'",
            fast=True,
        ),
        _m(
            "gloo-gather-slices-misordered",
            "on gloo a gather along a later dimension writes each rank's part into another rank's slice",
            "shardcore/distributed/collectives.py",
            (
                "out.narrow(dim, r * n, n) for r in range(world)",
                "out.narrow(dim, (world - 1 - r) * n, n) for r in range(world)",
            ),
            "tests/test_core_sync.py::test_tensor_collectives_match_lists_and_cat_along_every_dimension",
            "all-gather along 1",
        ),
        _m(
            "watch-silent",
            "a collective that outlives its bound on NCCL is never named (the watch does not report)",
            "shardcore/distributed/watch.py",
            ("        REPORTS.append(message)\n", ""),
            "tests/test_core_sync.py::test_a_hang_on_a_watchdog_backend_is_named_at_the_bound",
            "not enough values to unpack (expected 1, got 0)",
        ),
        _m(
            "input-gate-never-rechecks",
            "the input check runs on the first forward only, not again when the inputs' shapes change",
            "shardcore/consistency.py",
            ("        if signature != self.last:", "        if self.last is None:"),
            "tests/test_core_consistency.py::test_the_check_runs_on_the_first_forward_and_on_new_shapes_or_always_or_never",
            "input check's all-gathers per forward",
        ),
        _m(
            "ring-merge-not-rescaled",
            "ring attention adds each block's output without rescaling the running result to the new log-sum-exp",
            "shardcore/sequence/blocks.py",
            (
                "    out[:, :, rows] = now_out * torch.exp(now_lse - safe).unsqueeze(-1) + piece_out",
                "    out[:, :, rows] = now_out + piece_out",
            ),
            "tests/test_core_ring.py::test_ring_attention_equals_full_attention[causal-2-fused]",
            "ring attention differs from full attention",
        ),
        _m(
            "ring-diagonal-chunk-unmasked",
            "ring attention: a query chunk sees its own key chunk whole, later tokens included (causal flag lost)",
            "shardcore/sequence/blocks.py",
            (
                "(j + 1) * half), None, theirs == mine)",
                "(j + 1) * half), None, False)",
            ),
            "tests/test_core_ring.py::test_ring_attention_equals_full_attention[zigzag-4-fused]",
            "ring attention differs from full attention",
        ),
        _m(
            "ring-masked-row-counted",
            "ring attention: a row that sees no key of a block keeps the fused kernel's log-sum-exp (0, not -inf)",
            "shardcore/sequence/blocks.py",
            ('        lse = lse.masked_fill(_sees_nothing(piece.mask), float("-inf"))', "        pass"),
            "tests/test_core_ring.py::test_ring_attention_equals_full_attention[padded-2-fused]",
            "ring attention differs from full attention",
        ),
        _m(
            "ring-gradients-not-home",
            "ring attention's key/value gradients stop one hop short of their owner (the last shift skipped)",
            "shardcore/sequence/ring.py",
            (
                "            if world > 1:  # after the last step the block goes home with every rank's gradients",
                "            if world > 1 and step < world - 1:",
            ),
            "tests/test_core_ring.py::test_ring_attention_equals_full_attention[padded-4-math]",
            "ring shifts (3, 3)",
        ),
        _m(
            "moe-expert-shares-not-summed",
            "shard-moe: each rank returns its own experts' share of the tokens (the all-reduce dropped)",
            "shardcore/expert_parallel/experts.py",
            ("        return reduce_from_tp(out, group)", "        return out"),
            "plugins/shard-moe/tests/test_moe_tp.py::test_matches_unsharded[mixtral-tp2]",
            "max abs diff",
        ),
        _m(
            "moe-router-gradient-partial",
            "shard-moe: the routing weights' gradient left at this rank's experts' share (router trains apart)",
            "shardcore/expert_parallel/experts.py",
            ("torch.where(mine, copy_to_tp(top_k_weights, group), 0.0)", "torch.where(mine, top_k_weights, 0.0)"),
            "plugins/shard-moe/tests/test_moe_tp.py::test_matches_unsharded[mixtral-tp2]",
            "gradient of model.",
        ),
        _m(
            "checkpoint-parts-first-rows",
            "load_checkpoint: every rank reads the first experts' pieces of a tensor kept in pieces",
            "shardcore/checkpoint/parts.py",
            ("            rows = range(start, stop)", "            rows = range(0, stop - start)"),
            "plugins/shard-moe/tests/test_moe_workflow.py::test_checkpoint_in_per_expert_layout_read_on_shard[mixtral]",
            "after lazy load: max abs diff",
        ),
        _m(
            "split-norm-backward-not-summed",
            "SplitRMSNorm: the sum of squares' gradient left at this rank's share (backward all-reduce dropped)",
            "shardcore/tensor_parallel/split_norm.py",
            (
                '        return all_reduce(grad.contiguous().clone(), ctx.group, where="backward of split RMSNorm"), None',
                "        return grad, None",
            ),
            "plugins/shard-moe/tests/test_moe_tp.py::test_matches_unsharded[olmoe-tp2]",
            "gradient of model.",
        ),
        _m(
            "column-embedding-next-rank-heads",
            "ColumnParallelEmbedding1D: each rank holds the next rank's heads' columns of the table (T5's relative bias)",
            "shardcore/tensor_parallel/column_embedding.py",
            (
                '        self._shard_param("weight", weight, spec)\n',
                '        self._shard_param("weight", weight.roll(-spec.local_size, dims=1), spec)\n',
            ),
            "plugins/shard-t5/tests/test_t5_tp.py::test_matches_unsharded[t5-tp2]",
            "this rank's tensor is not its slice of the unsharded parameter",
        ),
        _m(
            "t5-shared-embedding-apart",
            "shard-t5: the shared embedding left a module of its own, which the forward never calls",
            "plugins/shard-t5/shard_t5/policy.py",
            ("                self.model.shared = encoder\n", "                pass\n"),
            "plugins/shard-t5/tests/test_t5_tp.py::test_explain_predicts_a_step",
            "bytes per step, this rank put",
        ),
        _m(
            "alibi-first-heads",
            "heads_of_this_rank: every rank adds the first heads' ALiBi slopes (BLOOM), not its own heads'",
            "shardcore/builders.py",
            (
                "        full, start = local * split.tp_size, local * split.tp_rank\n",
                "        full, start = local * split.tp_size, 0\n",
            ),
            "plugins/shard-bloom/tests/test_bloom_tp.py::test_matches_unsharded[causal-tp2]",
            "output 'logits': max abs diff",
        ),
        _m(
            "falcon-alibi-mask-whole",
            "shard-falcon: the per-head mask ALiBi was folded into reaches every rank whole, not cut to its heads",
            "plugins/shard-falcon/shard_falcon/policy.py",
            ('("alibi", "attention_mask"))', '("alibi",))'),
            "plugins/shard-falcon/tests/test_falcon_tp.py::test_matches_unsharded[alibi-tp2]",
            "output 'logits': max abs diff",
        ),
        _m(
            "glm-gate-up-split-as-one",
            "shard-glm: the fused [gate; up] split as one block (rank 0 all gate, rank 1 all up), not half by half",
            "plugins/shard-glm/shard_glm/policy.py",
            ('kwargs={"heads": (width, width), "head_dim": 1}', 'kwargs={"heads": (2 * width,), "head_dim": 1}'),
            "plugins/shard-glm/tests/test_glm_tp.py::test_matches_unsharded[glm-tp2]",
            "output 'logits': max abs diff",
        ),
        _m(
            "composite-glue-reaches-into-parts",
            "a composite policy's own descriptions also matched inside its parts (a part's blocks replaced twice)",
            "shardcore/sharder.py",
            ("                continue  # the part's own policy plans it\n", "                pass\n"),
            "tests/test_core_composite.py::test_each_part_is_sharded_by_the_policy_the_registry_finds[2]",
            "expected size 128 along dim 0, got shape (64, 64)",
            fast=True,
        ),
        _m(
            "sam-rel-pos-gradient-partial",
            "shard-sam: the relative-position tables' gradient left at this rank's heads' share (not summed)",
            "plugins/shard-sam/shard_sam/policy.py",
            (
                "        return TensorParallelSpec(grad_sum=[n for n, _ in self.model.named_parameters() if n.endswith(tables)])",
                "        return TensorParallelSpec()",
            ),
            "plugins/shard-sam/tests/test_sam_tp.py::test_matches_unsharded[rel-pos-tp2]",
            "gradient of vision_encoder.layers.0.attn.rel_pos_h",
        ),
        _m(
            "explain-row-bytes-of-its-slice",
            "explain: a row-parallel layer's all-reduce counted at its input slice's width, not its output's",
            "shardcore/tensor_parallel/linear.py",
            (
                '        return {"forward": [tokens * self.out_features * itemsize], "backward": backward}',
                '        return {"forward": [tokens * self.spec.local_size * itemsize], "backward": backward}',
            ),
            f"{LLAMA}/test_llama_kernels.py::test_explain_predicts_a_step[gqa]",
            "bytes per step, this rank put",
        ),
        _m(
            "ep-token-returned-to-wrong-row",
            "expert parallelism: the experts' outputs come back to the rows in send order, not the tokens' order",
            "shardcore/expert_parallel/__init__.py",
            (
                "        return whole.index_copy(0, sent, returned)",
                "        return whole.index_copy(0, sent.sort().values, returned)",
            ),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2]",
            "mean loss over the data-parallel ranks",
        ),
        _m(
            "ep-expert-gradient-not-averaged",
            "expert parallelism: an expert's gradient left as the sum over the ranks' losses (not divided by dp)",
            "shardcore/expert_parallel/__init__.py",
            ("        grad = grad / dp\n", "        grad = grad\n"),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2]",
            "gradient of model.layers.0.mlp.experts.",
        ),
        _m(
            "ep-expert-replicas-not-summed",
            "expert parallelism: an expert's gradient not summed over the ranks holding the same experts",
            "shardcore/expert_parallel/__init__.py",
            (
                '        return all_reduce(grad, replicas, where="backward of the experts (gradient summed over their replicas)")',
                "        return grad",
            ),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2-dp4]",
            "gradient of model.layers.0.mlp.experts.",
        ),
        _m(
            "ep-global-balance-one-rank",
            "global-batch balancing: the load-balancing loss from this rank's router statistics only",
            "shardcore/expert_parallel/__init__.py",
            (
                "        return _GatherOver.apply(t, group) if group_size(group) > 1 else t",
                "        return t",
            ),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2-global-balance]",
            "mean loss over the data-parallel ranks",
        ),
        _m(
            "ep-global-balance-gradient-not-summed",
            "global-batch balancing: each rank's rows get only its own copy of the loss's gradient (the backward's sum dropped)",
            "shardcore/expert_parallel/__init__.py",
            (
                "        return reduce_scatter_cat(grad.contiguous(), ctx.group, 0, where=ctx.back), None",
                "        return grad.chunk(group_size(ctx.group))[torch.distributed.get_rank(ctx.group)], None",
            ),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2-global-balance]",
            "gradient of model.",
            fast=True,
        ),
        # -- the layout chooser (explain --auto, ShardConfig(auto=...)) ----------------------------
        _m(
            "auto-memory-cap-ignored",
            "explain --auto ranks every layout as fitting, whatever its bytes per rank and the cap",
            "shardcore/cost/search.py",
            ('        row["fits"] = row["memory_bytes"]["total"] <= cap', '        row["fits"] = True'),
            f"{LLAMA}/test_llama_auto.py::test_the_chosen_layout_never_exceeds_the_memory_cap",
            "the cap did not rule out",
            fast=True,
        ),
        _m(
            "auto-pipeline-bubble-dropped",
            "the cost model's pipeline: M microbatches in M slots, no (P - 1) bubble",
            "shardcore/cost/model.py",
            ("    path = (sum(inner) + (m - 1) * max(inner)) / m\n", "    path = max(inner)\n"),
            f"{LLAMA}/test_llama_auto.py::test_a_pipeline_bubble_costs_on_dedicated_devices_and_is_reclaimed_where_ranks_share_them",
            "pipeline bubble",
        ),
        _m(
            "auto-pipeline-largest-stage-slots",
            "the cost model's pipeline: M + P - 1 slots of the largest stage, as if a heavy last stage waited on its own",
            "shardcore/cost/model.py",
            (
                "    path = (sum(inner) + (m - 1) * max(inner)) / m\n",
                "    path = (m + len(inner) - 1) * max(inner) / m\n",
            ),
            "tests/test_core_cost.py::test_a_pipeline_waits_on_the_other_stages_single_slots",
            "a heavy last stage's step:",
        ),
        _m(
            "auto-shape-factor-ignored",
            "the cost model's compute at the reference block's rate whatever the rank's microbatch shape",
            "shardcore/cost/model.py",
            ("    factor = shape_factor(here, dtype, tokens, tp)\n", "    factor = 1.0\n"),
            "tests/test_core_cost.py::test_the_compute_rate_follows_the_rank_s_microbatch_shape",
            "at half the reference block's rate the step took",
        ),
        _m(
            "calibrate-shape-reference-apart",
            "calibrate's block shapes over a reference timed apart from them (here: the smallest shape's rate)",
            "shardcore/cost/measure.py",
            ("    reference = rate[1, batch * seq]\n", "    reference = rate[1, min(SHAPE_TOKENS)]\n"),
            "tests/test_core_cost.py::test_calibrate_measures_once_and_caches",
            "the reference shape's factor is",
        ),
        _m(
            "auto-optimizer-mean-size",
            "the cost model's optimizer step priced at the mean tensor size: embeddings as cheap per byte as projections",
            "shardcore/cost/model.py",
            (
                "    sizes = [b / shard for b in stage.dense_sizes] + list(stage.expert_sizes)\n",
                "    sizes = []\n",
            ),
            "tests/test_core_cost.py::test_the_optimizer_step_is_timed_tensor_by_tensor",
            "not tensor by tensor",
        ),
        _m(
            "auto-choice-not-broadcast",
            "ShardConfig(auto=...): rank 0's choice (or its error) never sent to the other ranks",
            "shardcore/cost/auto.py",
            ('    message = broadcast_object(message, 0, where="the automatic layout chosen by rank 0")\n', ""),
            f"{LLAMA}/test_llama_auto.py::test_auto_refuses_alike_on_every_rank_with_what_to_do",
            "the ranks refused unalike",
        ),
        # -- the kit itself (caught by the kit's self-tests) --------------------------------------
        _m(
            "kit-gradient-tolerance-loosened",
            "the kit's gradient check loosened a million times",
            "shardcore/testing/compare.py",
            ("        if not rel <= rtol:\n", "        if not rel <= rtol * 1e6:\n"),
            "tests/test_core_kit_selftest.py::test_kit_fails_on_a_gradient_one_percent_off",
            "DID NOT RAISE",
            fast=True,
        ),
        _m(
            "kit-slice-check-removed",
            "the kits' per-rank gradient check removed (only gathered gradients compared)",
            "shardcore/testing/compare.py",
            (
                '    return _check_grads(pairs, where="this rank\'s slice", **check)',
                "    return 0.0",
            ),
            f"{LLAMA}/test_llama_tp.py::test_kit_sees_a_replica_that_diverged",
            "DID NOT RAISE",
        ),
        _m(
            "stale-checkpoint-files-kept",
            "save_checkpoint over an earlier checkpoint leaves its files (a stale index is read first)",
            "shardcore/checkpoint/hf_save.py",
            ("        if old != marker:\n            old.unlink()\n", "        pass\n"),
            "tests/test_core_checkpoint_safety.py::test_a_save_over_an_earlier_checkpoint_replaces_it_wholly[many-then-one]",
            "the load returned the earlier checkpoint's weights",
            fast=True,
        ),
        _m(
            "dcp-save-in-place",
            "save_distributed writes over the earlier checkpoint's files in place (no staging, no swap)",
            "shardcore/checkpoint/dcp.py",
            (
                ("    dcp.save(state, checkpoint_id=str(staging))", "    dcp.save(state, checkpoint_id=str(path))"),
                ("        atomic.finish(path, staging)", "        pass"),
            ),
            "tests/test_core_checkpoint_crash.py::test_a_rank_killed_inside_a_dcp_save_leaves_the_earlier_checkpoint",
            "the earlier DCP checkpoint changed",
        ),
        _m(
            "trainer-resumes-an-interrupted-checkpoint",
            "resume_from_checkpoint=True takes the newest checkpoint-N whether or not its save completed",
            "shardcore/integrations/hf/trainer.py",
            ('            atomic.check_recorded(directory, "shardcore.hf.Trainer checkpoint")', "            pass"),
            f"{LLAMA}/test_llama_trainer.py::test_resume_passes_over_an_interrupted_checkpoint_and_refuses_one_named",
            "not the newest complete checkpoint-2",
        ),
        _m(
            "restart-on-the-shared-store",
            "a job torchrun restarted joins its group on the store keys the dead attempt left",
            "shardcore/distributed/__init__.py",
            (
                '    return {"store": dist.PrefixStore(f"shardcore/attempt-{attempt}", agent),',
                '    return {"store": agent,',
            ),
            "tests/test_core_consistency.py::test_a_job_torchrun_restarted_gets_store_keys_of_its_own[1]",
            "a restarted job's group used the shared store's keys",
        ),
        _m(
            "shard-spec-replicas-interleaved",
            "replicated KV heads dealt round robin (rank r holds head r % n), cut and gathered alike",
            "shardcore/tensor_parallel/shard_spec.py",
            (
                (
                    "        return rank * segment.num_shards // self.tp_size",
                    "        return rank % segment.num_shards",
                ),
                (
                    "                first_rank = -(-shard * self.tp_size // seg.num_shards)",
                    "                first_rank = shard",
                ),
            ),
            "tests/test_core_layers.py::test_each_rank_s_slice_is_the_rows_counted_by_hand",
            "heads((4, 2, 2), 2, 4): rank 1 holds rows",
        ),
        _m(
            "vocab-loss-sums-unrescaled",
            "vocab-parallel cross entropy sums each rank's exp sum without rescaling it to the global max",
            "shardcore/tensor_parallel/loss.py",
            ("        sum_exp = (sums * (maxes - global_max).exp()).sum(dim=0)", "        sum_exp = sums.sum(dim=0)"),
            "tests/test_core_layers.py::test_vocab_parallel_cross_entropy[2]",
            "vocab-parallel loss",
        ),
        _m(
            "layout-dp-innermost",
            "the mesh's coordinates counted with dp innermost: TP groups across nodes, not neighbours",
            "shardcore/distributed/layout.py",
            ("        for d in reversed(DIMS):", "        for d in DIMS:"),
            "tests/test_core_config.py::test_layout_in_one_process",
            "rank 1 of dp2 x pp2 x tp2 sits at",
        ),
        _m(
            "bert-region-entry-dropped",
            "BERT's self-attention not entered into the TP region: q, k, v's input gradient never summed",
            "plugins/shard-bert/shard_bert/policy.py",
            ('                enter_tp_region=["attention.self"],\n', ""),
            "plugins/shard-bert/tests/test_bert_tp.py::test_bert_classes[BertModel-2]",
            "BertModelPolicy: 'attention.self.query' of BertLayer is built with copy_input=False",
        ),
        _m(
            "vit-region-entry-dropped",
            "ViT's attention not entered into the TP region: q, k, v's input gradient never summed",
            "plugins/shard-vit/shard_vit/hf_policy.py",
            (
                '                enter_tp_region=["attention"],\n                per_rank_rng=["attention"],',
                '                per_rank_rng=["attention"],',
            ),
            "plugins/shard-vit/tests/test_vit_hf.py::test_hf_vit_classes[ViTModel-2]",
            "HFViTPolicy: 'attention.q_proj' of ViTLayer is built with copy_input=False",
        ),
        _m(
            "timm-region-entry-dropped",
            "timm's attention not entered into the TP region: the fused qkv's input gradient never summed",
            "plugins/shard-vit/shard_vit/timm_policy.py",
            ('                enter_tp_region=["attn"],\n', ""),
            "plugins/shard-vit/tests/test_vit_timm.py::test_timm_models[vit_small_patch16_224-2]",
            "TimmViTPolicy: 'attn.qkv' of Block is built with copy_input=False",
        ),
        _m(
            "clip-region-entry-dropped",
            "CLIP's attentions not entered into the TP region: q, k, v's input gradient never summed",
            "plugins/shard-clip/shard_clip/policy.py",
            ("                enter_tp_region=regions,  # q, k, v read one tensor: one backward all-reduce\n", ""),
            "plugins/shard-clip/tests/test_clip_tp.py::test_matches_unsharded[clip-tp2]",
            "CLIPPolicy: 'encoder.layers.0.self_attn.q_proj' of CLIPTextModel is built with copy_input=False",
        ),
        _m(
            "opt-region-entry-dropped",
            "OPT's attention not entered into the TP region: q, k, v's input gradient never summed",
            "plugins/shard-opt/shard_opt/policy.py",
            (
                '                enter_tp_region=["self_attn"],  # q, k, v read one tensor: one backward all-reduce for the three\n',
                "",
            ),
            "plugins/shard-opt/tests/test_opt_tp.py::test_matches_unsharded[causal-tp2]",
            "OPTPolicy: 'self_attn.q_proj' of OPTDecoderLayer is built with copy_input=False",
        ),
        _m(
            "safetensors-header-trusted",
            "a safetensors header read as it says: a dtype or shape that does not fit its bytes reinterprets them",
            "shardcore/checkpoint/safetensors_io.py",
            ("    if stop - begin != nbytes:", "    if False:"),
            "tests/test_core_bad_input.py::test_a_damaged_checkpoint_is_refused_by_name_on_every_rank_before_any_collective[header-lies-about-dtype]",
            "the header-lies-about-dtype checkpoint: loaded",
        ),
        _m(
            "vocab-loss-gradient-doubled",
            "the vocab-parallel cross entropy's backward twice too large: every gradient of the model doubled",
            "shardcore/tensor_parallel/loss.py",
            (
                "        grad.mul_((grad_loss * kept).unsqueeze(-1))",
                "        grad.mul_((2 * grad_loss * kept).unsqueeze(-1))",
            ),
            f"{LLAMA}/test_llama_trainer.py::test_without_clipping_each_gradient_and_the_weights_match_one_process",
            "step 0: gradient norm",
        ),
        _m(
            "sdpa-gqa-keys-for-values",
            "shardcore's SDPA for grouped K/V on the CPU swaps keys and values: the same wrong kernel in the sharded run and its same-kernel reference",
            "shardcore/integrations/hf/attention.py",
            (
                "            query, key, value, attn_mask=attention_mask,",
                "            query, value, key, attn_mask=attention_mask,",
            ),
            f"{LLAMA}/test_llama_kernels.py::test_optimization_flags_at_tp2[flash]",
            "output 'logits': max abs diff 0.763 > 0.0001",
            fast=True,
        ),
        _m(
            "plan-axis-used-twice",
            "the plan reader lets one mesh axis split two dimensions of a tensor (each rank then holds a corner)",
            "shardcore/plan/syntax.py",
            ("        if spec is not None and sum(a == axis for a in spec) > 1:", "        if False:"),
            "tests/test_core_plan.py::test_plan_syntax[plan0-splits more than one dimension]",
            "was read without an error (expected: splits more than one dimension)",
            fast=True,
        ),
        _m(
            "input-digest-on-the-cpu",
            "the input check's digest made on the CPU whatever the group (an NCCL-only group refuses it)",
            "shardcore/consistency.py",
            (
                "    mine = _combined(digests, group_device(group))",
                '    mine = _combined(digests, torch.device("cpu"))',
            ),
            "tests/test_core_devices.py::test_the_input_check_puts_its_digest_where_the_group_needs_it",
            "the input check's digest was made on the CPU",
        ),
        _m(
            "tensor-parallel-imports-kernels",
            "the fused norms look the kernels up from below them (a package-level import cycle)",
            "shardcore/tensor_parallel/norm.py",
            (
                "def _apex_layer_norm():\n    try:",
                "def _apex_layer_norm():\n    from ..kernels import flash_attn_available  # noqa: F401\n\n    try:",
            ),
            "tests/test_core_architecture.py::test_no_import_cycle_between_packages",
            "package-level import cycle: tensor_parallel -> kernels -> tensor_parallel",
        ),
        _m(
            "pipeline-activations-on-the-default-device",
            "the forward-only pipeline's broadcast buffers made without a device (the CPU on a GPU run)",
            "shardcore/pipeline/runtime.py",
            (
                "            x = tuple(torch.empty(shape, dtype=dtype, device=group_device(info.group)) for",
                "            x = tuple(torch.empty(shape, dtype=dtype) for",
            ),
            f"{LLAMA}/test_llama_device_audit.py::test_every_collective_gets_a_tensor_on_the_model_s_device[pipeline-forward-only]",
            "broadcast (the forward-only pipeline's activations) got a tensor on meta",
        ),
        _m(
            "save-rendezvous-on-the-default-device",
            "save_pretrained's rendezvous tensor made without a device (a CPU tensor on an NCCL group)",
            "shardcore/integrations/hf/save.py",
            ("torch.zeros(1, device=group_device(world))", "torch.zeros(1)"),
            f"{LLAMA}/test_llama_device_audit.py::test_every_collective_gets_a_tensor_on_the_model_s_device[save_pretrained]",
            "all_reduce (save_pretrained of a sharded model: every rank must call it",
        ),
        # -- plans shardcore did not write: the checks and the styles ---------------------------------
        _m(
            "block-check-disabled",
            "the block check at optimize compares nothing (BlockProbe.compare returns at once)",
            "shardcore/verify/probe.py",
            (
                "        problems: list[str] = []\n        summed: list[str] = []\n",
                "        return []\n        problems: list[str] = []\n        summed: list[str] = []\n",
            ),
            "tests/test_core_verify.py::test_a_plan_that_changes_the_output_is_refused_at_optimize",
            "the block check let a wrong plan through",
        ),
        _m(
            "plan-returns-the-vocab-slice",
            "a plan's head on a plain model returns each rank's vocabulary slice again (no split found leaving)",
            "shardcore/plan/policy.py",
            ("        return heads | leave\n", "        return heads\n"),
            "tests/test_core_own_model.py::test_the_head_s_split_comes_back_whole",
            "the head's split came back as each rank's slice",
            fast=True,
        ),
        _m(
            "block-check-skips-plain-models",
            "the block check finds no input for a model without HF conventions (0.1's probe)",
            "shardcore/inputs.py",
            (
                '        return (hf, "") if hf is not None else _from_signature(model, gen)\n',
                '        return (hf, "") if hf is not None else (None, "it takes neither token ids nor an image")\n',
            ),
            "tests/test_core_own_model.py::test_own_model_with_a_yaml_plan_is_the_unsharded_model[plan-as-written-2]",
            "the block check at optimize did not run (it takes neither token ids nor an image)",
        ),
        _m(
            "flow-walks-through-rows",
            "the walk from the model's outputs goes on past a row-parallel layer (every column found leaving)",
            "shardcore/plan/flow.py",
            ('        if kind == "row":  # the split was reduced here\n            continue\n', ""),
            "tests/test_core_own_model.py::test_splits_reduced_inside_the_model_are_not_gathered",
            "a column was taken for leaving the model",
        ),
        _m(
            "vocab-slice-passes-for-whole",
            "F.cross_entropy on a parallel_output slice gives a number (the slice's refusal dropped)",
            "shardcore/tensor_parallel/vocab_slice.py",
            ("            if func in _REFUSED and mark is not None:\n", "            if False:\n"),
            "tests/test_core_own_model.py::test_parallel_output_keeps_the_slice_and_refuses_a_whole_logits_loss[2]",
            "'refused': 'no error'",
        ),
        _m(
            "raise-not-located",
            "a block that raises once sharded is refused without naming the module that raised",
            "shardcore/verify/locate.py",
            ("    found = trace.raised_in()\n", "    found = None\n"),
            "tests/test_core_own_model.py::test_a_norm_over_the_split_width_is_refused_at_optimize_by_name[inputs-found]",
            "blocks.0 (Block): raised, sharded: RuntimeError",
        ),
        _m(
            "found-partial-gradients-not-summed",
            "the replicated parameters the block check finds partial are named but never summed",
            "shardcore/verify/probe.py",
            ("                sum_gradients_over_group({names[-1]: param}, group)\n", "                pass\n"),
            "tests/test_core_verify.py::test_replicated_parameter_on_split_activations_gets_its_gradient_summed[2]",
            "a partial gradient left unsummed",
        ),
        _m(
            "first-step-check-disabled",
            "the first-backward gradient check never armed (check_first_backward returns at once)",
            "shardcore/verify/first_step.py",
            ("    split = set(parameter_specs(model))\n", "    return\n    split = set(parameter_specs(model))\n"),
            "tests/test_core_verify.py::test_the_first_backward_check_names_partial_gradients",
            "the first-step check let partial gradients through",
            fast=True,
        ),
        _m(
            "moe-experts-output-not-summed",
            "moe_tp_experts without the all-reduce of the experts' partial output",
            "shardcore/tensor_parallel/in_place.py",
            (
                "            module.register_forward_pre_hook(enter, with_kwargs=True)\n            module.register_forward_hook(lambda mod, args, out: reduce_from_tp(out, group))\n",
                "            module.register_forward_pre_hook(enter, with_kwargs=True)\n",
            ),
            "tests/test_core_families.py::test_family_exact[deepseek_v3]",
            "deepseek_v3: refused: ShardingCheckError",
        ),
        # -- training at scale: 3-D layouts, ZeRO-2, HSDP, mixed precision, fp16 loss scaling -------------
        _m(
            "overflow-agreement-dropped",
            "fp16 overflow: each rank decides from its own gradient slices (the flag's all-reduce dropped)",
            "shardcore/amp.py",
            ("    all_reduce(shared, group, op=torch.distributed.ReduceOp.MAX, where=_WHERE)\n", ""),
            f"{LLAMA}/test_llama_amp.py::test_an_overflow_on_one_rank_skips_the_step_on_every_rank[tp2]",
            "stepped [True, True, True]",
            fast=True,
        ),
        _m(
            "pipeline-stage-ends-not-data-parallel",
            "under pipeline x FSDP only the blocks are wrapped: the stage's embedding, norm and head are never reduced",
            "shardcore/data_parallel/__init__.py",
            (
                "                fully_shard(block, mesh=mesh, **kwargs)\n            fully_shard(root, mesh=mesh, **kwargs)\n",
                "                fully_shard(block, mesh=mesh, **kwargs)\n",
            ),
            f"{LLAMA}/test_llama_pipeline_data_parallel.py::test_pp2_x_dp2_trains_like_unsharded[fsdp-1f1b]",
            "(held, gathered over tp): relative error",
        ),
        _m(
            "hsdp-on-the-flat-mesh",
            "data_parallel='hsdp' runs on the 1-D dp mesh: plain FSDP, nothing replicated",
            "shardcore/data_parallel/__init__.py",
            (
                '    if config.data_parallel == "hsdp":\n        return layout.hsdp_mesh',
                "    if False:\n        return layout.hsdp_mesh",
            ),
            f"{LLAMA}/test_llama_data_parallel.py::test_trains_like_unsharded_full_batch[hsdp2x2]",
            "HSDP wants a (replicate, shard=2) mesh",
        ),
        _m(
            "zero2-reshards-after-forward",
            "data_parallel='zero2' without reshard_after_forward=False: plain FSDP's memory and traffic",
            "shardcore/data_parallel/__init__.py",
            ('            kwargs["reshard_after_forward"] = False\n', "            pass\n"),
            f"{LLAMA}/test_llama_data_parallel.py::test_trains_like_unsharded_full_batch[zero2xtp2]",
            "weights kept gathered after forward: {False}",
        ),
        _m(
            "mixed-precision-ignored",
            "ShardConfig(mixed_precision='bf16') accepted but FSDP's MixedPrecisionPolicy never given",
            "shardcore/data_parallel/__init__.py",
            ("    if config.mixed_precision is not None:  # compute in it", "    if False:  # compute in it"),
            f"{LLAMA}/test_llama_data_parallel.py::test_bf16_mixed_precision_fsdp_x_tp_within_bf16_of_the_unsharded_autocast_run",
            "the sharded model computed in torch.float32, not bf16",
            fast=True,
        ),
        # -- computing files without a mutant before (issue: a harness that cannot report a false catch) --
        _m(
            "audit-deaf-to-host-syncs",
            "the wrapper's barriers and object collectives never reach the sync audit's listeners",
            "shardcore/distributed/audit.py",
            ("        listener(kind)", "        pass"),
            "tests/test_core_sync.py::test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device",
            "the sync audit heard []",
        ),
        _m(
            "audit-device-blind",
            "the device-strict audit lets any tensor through (a CPU buffer on an NCCL group passes)",
            "shardcore/distributed/audit.py",
            ("    if STRICT and tensor.device != STRICT[-1]:", "    if False:"),
            "tests/test_core_sync.py::test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device",
            "the device-strict audit let a tensor on meta reach all_reduce: refused 'nothing'",
        ),
        _m(
            "grad-sum-not-summed",
            "a replicated parameter on split activations keeps its rank's partial gradient (no all-reduce)",
            "shardcore/tensor_parallel/grad_sum.py",
            ("        return all_reduce(grad.contiguous().clone(), group, where=where)", "        return grad"),
            "tests/test_core_verify.py::test_replicated_parameter_on_split_activations_gets_its_gradient_summed[2]",
            "the gradients of layers.0.alpha, layers.1.alpha differ across the tensor-parallel ranks",
        ),
        _m(
            "example-main-not-importable",
            "an example loaded by path is not put in sys.modules, so its main cannot reach the ranks",
            "shardcore/testing/examples.py",
            ("        sys.modules[name] = module\n", ""),
            f"{LLAMA}/test_llama_examples.py::test_pipeline_training_equals_the_unsharded_loop",
            "'shardcore_example_pipeline_training'",
        ),
        _m(
            "kit-dropout-always-same",
            "the kit's dropout report says every rank dropped the same positions whatever they dropped",
            "shardcore/testing/sequence.py",
            ("        same[path] = all(torch.equal(m, masks[0]) for m in masks)", "        same[path] = True"),
            "plugins/shard-bert/tests/test_bert_sequence.py::test_dropout_on_split_tokens_draws_per_rank_and_replicated_dropout_stays_in_step",
            "every rank dropped the same positions of its own tokens",
        ),
        _m(
            "explain-expert-elements-not-bytes",
            "explain --ep counts the experts' elements, not their bytes",
            "shardcore/explain/experts.py",
            ("p.numel() * p.element_size()", "p.numel()"),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_explain_predicts_a_step[2-2-1]",
            "explain says rank 0 holds 73728 bytes of experts, not 294912",
        ),
        _m(
            "full-tensors-not-gathered",
            "full_named_tensors yields each rank's slice of a split parameter, not the whole tensor",
            "shardcore/sharded_state.py",
            (
                "            yield name, None if tensor is None else spec.gather(tensor, group)",
                "            yield name, tensor",
            ),
            "tests/test_core_kit_selftest.py::test_kit_passes_the_right_model",
            "gradient of embed.weight (gathered): shape (64, 64) != unsharded (128, 64)",
        ),
        _m(
            "kit-generation-accepts-constant-tokens",
            "the generation check accepts a test input whose unsharded tokens barely vary (it cannot fail)",
            "shardcore/testing/generation.py",
            ("        if len(set(row)) < min_distinct:", "        if False:"),
            "tests/test_core_kit_selftest.py::test_the_generation_check_fails_on_other_tokens_scores_and_inputs_that_cannot_fail[input-that-cannot-fail]",
            "the generation check refused 'nothing (the check passed)', not 'barely vary",
        ),
        _m(
            "checkpointing-recompute-without-streams",
            "HF gradient checkpointing's function is not wrapped: the recompute runs without shardcore's random streams",
            "shardcore/integrations/hf/checkpointing.py",
            ("                sub._gradient_checkpointing_func = _carrying(func, carried)", "                pass"),
            "plugins/shard-bert/tests/test_bert_dropout.py::test_gradient_checkpointing_is_exact",
            "a block recomputed by gradient (activation) checkpointing drew random numbers on its per-rank stream",
        ),
        _m(
            "ring-turned-around",
            "a ring step sends to the previous rank and receives from the next (blocks arrive in the reverse order)",
            "shardcore/distributed/ring.py",
            (
                "dist.P2POp(dist.isend, x, peer(rank + 1), group), dist.P2POp(dist.irecv, received, peer(rank - 1), group)",
                "dist.P2POp(dist.isend, x, peer(rank - 1), group), dist.P2POp(dist.irecv, received, peer(rank + 1), group)",
            ),
            "tests/test_core_ring.py::test_ring_attention_equals_full_attention[causal-4-fused]",
            "ring attention differs from full attention",
        ),
        _m(
            "pipeline-last-stages-take-more",
            "an uneven block split gives the last stages the extra block (the first stage also holds the embedding)",
            "shardcore/pipeline/schedule.py",
            ("(1 if s < extra else 0)", "(1 if s >= num_stages - extra else 0)"),
            "tests/test_core_pipeline.py::test_even_split_gives_the_first_stages_one_more",
            "5 blocks over 2 stages split as [2, 3]",
        ),
        _m(
            "explain-region-bytes-in-elements",
            "explain --seq prices a tensor-parallel region's backward all-reduce in elements, not bytes",
            "shardcore/explain/traffic.py",
            (
                '            step["backward"]["all_reduce"] += tokens * width * itemsize',
                '            step["backward"]["all_reduce"] += tokens * width',
            ),
            f"{LLAMA}/test_llama_kernels.py::test_explain_predicts_a_step[gqa]",
            "'backward': {'all_reduce': 9216}} bytes per step",
        ),
        _m(
            "conv1d-not-transposed",
            "the Conv1D layers take GPT-2's [in, out] weight for an nn.Linear's [out, in]",
            "shardcore/tensor_parallel/conv1d.py",
            ("    transposed = True", "    transposed = False"),
            "plugins/shard-gpt2/tests/test_gpt2_tp.py::test_conv1d_weights_keep_in_out_layout_split_per_head",
            "expected size 192 along dim 0, got shape (64, 192)",
        ),
        _m(
            "group-key-one-for-all",
            "every real process group gets the same cache key: the gradient norm sums the pipeline and tensor groups as one",
            "shardcore/distributed/ranks.py",
            ("    return tuple(group_ranks(group))", "    return (0,)"),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_clip_grad_norm_matches_unsharded",
            "clip_grad_norm_ (torch, norm_type=2) on rank 0: norm 2.296",
        ),
        _m(
            "auto-table-without-the-chosen",
            "explain --auto's table starts at the runner-up: the chosen layout is missing from it",
            "shardcore/cost/report.py",
            (
                '    for row in [r for r in result["ranked"] if r["fits"]][:top]:',
                '    for row in [r for r in result["ranked"] if r["fits"]][1:top]:',
            ),
            f"{LLAMA}/test_llama_auto.py::test_explain_auto_prints_the_choice_and_its_config",
            "not the chosen layout",
        ),
        _m(
            "hole-zero-end-passes-input",
            "a stage's hole for a position embedding hands the hidden states through instead of adding nothing",
            "shardcore/pipeline/hole.py",
            ("            hidden = torch.zeros(())", "            pass"),
            "plugins/shard-gpt2/tests/test_gpt2_pipeline.py::test_pipeline_trains_like_unsharded[2-1-1F1B]",
            "The size of tensor a (64) must match the size of tensor b (10)",
        ),
        _m(
            "non-hf-blocks-return-tuples",
            "a model outside transformers is taken to return (hidden, ...) from its blocks: its holes return tuples",
            "shardcore/pipeline/hooks.py",
            (
                "            return False\n        import transformers",
                "            return True\n        import transformers",
            ),
            "plugins/shard-vit/tests/test_vit_pipeline.py::test_timm_pipeline_trains_like_unsharded[gpipe]",
            "layer_norm(): argument 'input' (position 1) must be Tensor, not tuple",
        ),
        _m(
            "materialize-buffers-not-computed",
            "buffers left on meta by a meta build are filled but never computed by the policy",
            "shardcore/checkpoint/materialize.py",
            ("        _compute_buffers(model, policy, owners)\n", "        pass\n"),
            f"{LLAMA}/test_llama_checkpoint.py::test_torch_meta_device_build_computes_buffers_or_refuses",
            "the buffers ['model.rotary_emb.inv_freq', 'model.rotary_emb.original_inv_freq'] are not in the checkpoint",
        ),
        _m(
            "kit-save-pretrained-untrained",
            "the save_pretrained check saves the sharded model untrained (against the unsharded model trained one step)",
            "shardcore/testing/saving.py",
            ("    _sharded_backward(model, batch, loss_fn)\n", ""),
            "plugins/shard-gpt2/tests/test_gpt2_user_workflow.py::test_save_pretrained_loads_unsharded",
            "transformer.wte.weight loaded from save_pretrained differs from the unsharded model by",
        ),
        _m(
            "frozen-weight-thawed-by-sharding",
            "a parallel layer's slice requires grad whatever the native weight did (LoRA's frozen base trains)",
            "shardcore/tensor_parallel/parallel_module.py",
            ("        grad = full.requires_grad if requires_grad is None else requires_grad", "        grad = True"),
            f"{LLAMA}/test_llama_peft.py::test_lora_matches_unsharded_peft_model[lora-then-optimize-2]",
            "trainable here and frozen in the unsharded PEFT model, or the reverse: ['base_model.model.lm_head.weight'",
        ),
        _m(
            "recompute-forgets-the-forward",
            "a recomputed block runs with the live random streams and sequence split, not the forward's",
            "shardcore/tensor_parallel/recompute.py",
            ("                stack.enter_context(state.restore(token))", "                pass"),
            f"{LLAMA}/test_llama_sequence.py::test_gradient_checkpointing_matches_unsharded[split_gather-False]",
            "The size of tensor a (6) must match the size of tensor b (12) at non-singleton dimension 2",
        ),
        _m(
            "kit-explain-counts-the-first-step",
            "the explain check counts the first step, whose input check adds collectives a steady step does not issue",
            "shardcore/testing/explained.py",
            ("    _loss(model(**inputs), loss_fn).backward()  # the first step: the input check's forward\n", ""),
            "plugins/shard-bloom/tests/test_bloom_tp.py::test_explain_predicts_a_step",
            "this rank put {'forward': {'all_gather': 40976",
        ),
        _m(
            "replica-groups-interleaved",
            "the replica sub-groups of a tensor-parallel group are cut round robin, not into the consecutive ranks that hold one head",
            "shardcore/distributed/groups.py",
            (
                "list(tp[b : b + blocks]) for tp in",
                "list(tp[b // blocks :: len(tp) // blocks]) for tp in",
            ),
            f"{LLAMA}/test_llama_clipping.py::test_torch_clip_grad_norm_is_the_unsharded_norm[4]",
            "clip_grad_norm_ (torch, norm_type=2) on rank 0: norm 3.346",
        ),
        _m(
            "kit-expects-rank-zero-slices",
            "the kit's structural check expects every rank to hold rank 0's slices",
            "shardcore/testing/structure.py",
            (
                "            out[name] = spec.shard(tensor, group_rank(group))",
                "            out[name] = spec.shard(tensor, 0)",
            ),
            "tests/test_core_kit_selftest.py::test_kit_passes_the_right_model",
            "this rank's tensor is not its slice of the unsharded parameter",
        ),
        _m(
            "fused-layernorm-drops-bias",
            "enable_fused_normalization's LayerNorm keeps the weight but drops the native module's bias",
            "shardcore/tensor_parallel/norm.py",
            (
                "        new.weight, new.bias = module.weight, module.bias",
                "        new.weight, new.bias = module.weight, None",
            ),
            "plugins/shard-bert/tests/test_bert_kernels.py::test_optimization_flags_at_tp2[norm]",
            "missing ['bert.embeddings.LayerNorm.bias'",
        ),
        _m(
            "plan-embedding-split-over-width",
            "a plan splitting an embedding over its width (not the vocabulary) is taken as a vocabulary split",
            "shardcore/plan/layers.py",
            (
                "            if dim != 0:\n                raise PlanError(",
                "            if False:\n                raise PlanError(",
            ),
            f"{LLAMA}/test_llama_plan.py::test_bad_plans_are_refused_early_on_every_rank[embedding width]",
            "embedding width: refused with 'no error'",
        ),
        _m(
            "explain-ring-one-shift-too-many",
            "explain counts sp ring shifts per attention in the forward, not sp - 1",
            "shardcore/explain/sequence.py",
            (
                '        return {"ring_shift": sp - 1}, {"ring_shift": sp}',
                '        return {"ring_shift": sp}, {"ring_shift": sp}',
            ),
            f"{LLAMA}/test_llama_sequence.py::test_explain_predicts_a_step_over_sp[ring-sp2]",
            "explain predicts {'forward': {'ring_shift': 4, 'all_gather': 1}",
        ),
        _m(
            "zero-config-not-verified",
            "a plan shardcore did not write (zero-config, YAML) is not checked at optimize or at the first step",
            "shardcore/verify/__init__.py",
            ("    return config.verify is True or isinstance(policy, PlanPolicy)", "    return config.verify is True"),
            "tests/test_core_verify.py::test_replicated_parameter_on_split_activations_gets_its_gradient_summed[2]",
            "a partial gradient left unsummed: {'embed.weight'",
        ),
        _m(
            "explain-text-in-decimal-units",
            "explain's text divides by 1000 per unit while naming binary units (KB, MB, GB)",
            "shardcore/explain/report.py",
            ("        n /= 1024", "        n /= 1000"),
            f"{LLAMA}/test_llama_kernels.py::test_explain_7b_at_tp4",
            "explain's text says 'parameters: 23.7 GB unsharded",
        ),
        _m(
            "config-mode-without-sp-accepted",
            "ShardConfig accepts a sequence_parallelism_mode without enable_sequence_parallelism (silently no SP)",
            "shardcore/config.py",
            (
                "        if not self.enable_sequence_parallelism and self.sequence_parallelism_mode is not None:",
                "        if False:",
            ),
            "tests/test_core_config.py::test_sequence_parallel_flags_are_checked_in_the_constructor",
            "DID NOT RAISE ValueError",
        ),
        _m(
            "sp-unsupported-mode-accepted",
            "a sequence-parallel mode the policy does not support is not refused before sharding",
            "shardcore/sequence/check.py",
            ("    if mode not in supported:", "    if False:"),
            "plugins/shard-t5/tests/test_t5_tp.py::test_pipeline_and_sequence_parallelism_refused_by_name[sequence]",
            "refused with 'no error'",
        ),
        _m(
            "pipeline-one-stage-for-multistage",
            "a multi-stage schedule given one stage per rank is not refused",
            "shardcore/pipeline/check.py",
            ("    if not single and per_rank < 2:", "    if False:"),
            f"{LLAMA}/test_llama_pipeline.py::test_bad_pipeline_config_is_refused_on_every_rank[multi-stage schedule, one stage per rank]",
            "multi-stage schedule, one stage per rank: refused with 'no error'",
        ),
        _m(
            "composite-nested-parts-accepted",
            "a composite policy whose parts nest (one inside another) is not refused: the inner part is sharded twice",
            "shardcore/composite.py",
            ('                    if a != b and b.startswith(f"{a}."):', "                    if False:"),
            "tests/test_core_composite.py::test_parts_must_not_nest",
            "Nor does the model ship a tensor-parallel plan (config.base_model_tp_plan)",
        ),
        _m(
            "policy-mixed-blocks-accepted",
            "block_type() of a model mixing block classes answers the first class instead of refusing",
            "shardcore/policy.py",
            ("    if len(types) != 1:", "    if False:"),
            "tests/test_core_config.py::test_block_type_names_mixed_blocks",
            "DID NOT RAISE ValueError",
        ),
        _m(
            "derive-without-blocks-unnamed",
            "a model with no repeated blocks to derive a plan from fails on a None instead of a PlanError naming it",
            "shardcore/plan/derive.py",
            ("    if found is None:\n        raise PlanError(", "    if False:\n        raise PlanError("),
            "tests/test_core_verify.py::test_derive_names_what_it_could_not_read",
            "cannot unpack non-iterable NoneType object",
        ),
        _m(
            "zero-config-unknown-style-accepted",
            "a shipped tp_plan style zero-config does not translate is not refused by name",
            "shardcore/plan/zero_config.py",
            ("            if style not in STYLES:", "            if False:"),
            "tests/test_core_zero_config.py::test_unsupported_tp_style_is_named",
            "DID NOT RAISE PlanError",
        ),
        _m(
            "plan-tie-split-two-ways",
            "a plan giving two names of one tied parameter different specs is not refused",
            "shardcore/plan/policy.py",
            (
                "            if split and (len(split) != len(tied) or len({tuple(s) for s in split.values()}) > 1):",
                "            if False:",
            ),
            "tests/test_core_plan.py::test_tied_parameters_need_one_spec",
            "a tie split two ways: no error",
        ),
        _m(
            "kit-keeps-constant-parameters",
            "the kit builds its models as initialized: a norm of ones and zeros hides a norm built anew",
            "shardcore/testing/varied.py",
            ("                if bool((flat == flat[0]).all()):", "                if False:"),
            "tests/test_core_kit_selftest.py::test_kit_fails_on_a_norm_built_anew_instead_of_from_the_model_s_weights",
            "the kit passed a norm built anew (an init of ones hides it): refused 'nothing (the kit passed)'",
        ),
        _m(
            "disabled-plugins-loaded",
            "SHARDCORE_DISABLE_PLUGINS is read but a named plugin is loaded anyway",
            "shardcore/plugins.py",
            (
                '            if "all" in disabled or ep.name in disabled or ep.name in self.plugins:',
                "            if ep.name in self.plugins:",
            ),
            "tests/test_core_plugins.py::test_disable_plugins_env",
            "SHARDCORE_DISABLE_PLUGINS='other, good' left",
        ),
        _m(
            "kit-takes-late-refusals",
            "the kit's refusal check takes a refusal raised after a collective as one raised before any",
            "shardcore/testing/refusals.py",
            ('    if message != "no error" and calls and not collectives_allowed:', "    if False:"),
            "tests/test_core_kit_selftest.py::test_kit_flags_a_refusal_that_came_after_a_collective",
            "the kit took a late refusal as early",
        ),
        _m(
            "kit-structure-unchecked",
            "the kit skips its structural check (parallel modules, each rank's slices) at every size",
            "shardcore/testing/conformance.py",
            ("        if info.tp_size > 1:  # (TP=1", "        if info.tp_size > 8:  # (TP=1"),
            "tests/test_core_kit_selftest.py::test_kit_fails_on_one_ranks_slice",
            "Regex pattern did not match",
        ),
        _m(
            "blip2-vision-mlp-left-whole",
            "BLIP-2's vision encoder policy replaces no MLP: its blocks stay whole on every rank",
            "plugins/shard-blip2/shard_blip2/policy.py",
            (
                'ModulePolicyDescription(sub_module_replacement=mlp("mlp"))}',
                "ModulePolicyDescription(sub_module_replacement=[])}",
            ),
            "plugins/shard-blip2/tests/test_blip2_tp.py::test_matches_unsharded[opt-tp2]",
            "blocks ['vision_model.encoder.layers.0', 'vision_model.encoder.layers.1'] hold no parallel module",
        ),
        _m(
            "moe-k-norm-gradient-partial",
            "Qwen3-MoE's replicated k_norm (applied to each rank's heads) keeps its rank's partial gradient",
            "plugins/shard-moe/shard_moe/policy.py",
            (
                '        norms = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")',
                '        norms = ("self_attn.q_norm.weight",)',
            ),
            "plugins/shard-moe/tests/test_moe_tp.py::test_matches_unsharded[qwen3-moe-tp2-kv1]",
            "gradient of model.layers.0.self_attn.k_norm.weight (gathered): relative error",
        ),
        _m(
            "objects-barrier-unheard",
            "the wrapper's barrier blocks the host without telling the sync audit",
            "shardcore/distributed/objects.py",
            (
                '        _blocking("barrier", where)\n        work = dist.barrier(group=group, async_op=True)',
                "        work = dist.barrier(group=group, async_op=True)",
            ),
            "tests/test_core_sync.py::test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device",
            "the sync audit heard ['all_gather_object']",
        ),
        _m(
            "atomic-interrupted-swap-unnamed",
            "a distributed checkpoint whose save died between the two renames is refused as missing, not naming where the earlier one is",
            "shardcore/checkpoint/atomic.py",
            (
                "        if old.exists():\n            raise CheckpointError(",
                "        if False:\n            raise CheckpointError(",
            ),
            "tests/test_core_checkpoint_crash.py::test_a_writer_killed_between_the_renames_is_refused_naming_the_earlier_checkpoint",
            "does not exist (an interrupted save's files are at",
        ),
        _m(
            "pool-drops-rank-errors",
            "the rank pool takes a rank's exception for its result: a call that failed on every rank returns",
            "shardcore/distributed/launcher.py",
            (
                '                if status == "err":\n                    errors[rank] = value',
                "                if False:\n                    errors[rank] = value",
            ),
            "tests/test_core_parallelize.py::test_worker_exception_on_every_rank_keeps_the_handle",
            "DID NOT RAISE",
        ),
        _m(
            "worker-hides-tracebacks",
            "a rank reports that it failed but not its traceback",
            "shardcore/distributed/worker.py",
            (
                '            payload = pickle.dumps(("err", traceback.format_exc()))',
                '            payload = pickle.dumps(("err", "a rank failed"))',
            ),
            "tests/test_core_parallelize.py::test_worker_exception_on_every_rank_keeps_the_handle",
            "Regex pattern did not match",
        ),
        _m(
            "pipeline-tied-gradients-not-summed",
            "a weight tied across the first and last stages (GPT-2's embedding and head) keeps each stage's gradient",
            "shardcore/pipeline/stage.py",
            (
                "            if len(owners) > 1:\n                owners_of[pid] = owners",
                "            if False:\n                owners_of[pid] = owners",
            ),
            "plugins/shard-gpt2/tests/test_gpt2_pipeline.py::test_pipeline_trains_like_unsharded[2-1-1F1B]",
            "gradient of lm_head.weight (held, gathered over tp): relative error",
        ),
        _m(
            "moe-balance-loss-not-added",
            "global_batch_balance computes the whole batch's balance loss but never puts it into the model's loss",
            "plugins/shard-moe/shard_moe/balance.py",
            (
                "            output.loss = output.loss + mod.router_aux_loss_coef * (whole - local).to(output.loss.device)",
                "            pass",
            ),
            "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_matches_unsharded[mixtral-ep2-global-balance]",
            "mean loss over the data-parallel ranks 4.927",
        ),
        _m(
            "llava-vision-tower-not-a-part",
            "LLaVA's composite policy names the language model alone: the vision tower is not sharded",
            "plugins/shard-llava/shard_llava/policy.py",
            (
                "        return [self._path(base.vision_tower), self._path(base.language_model)]",
                "        return [self._path(base.language_model)]",
            ),
            "plugins/shard-llava/tests/test_llava_tp.py::test_matches_unsharded[2]",
            "the parts sharded: {'model.language_model': 'LlamaModelPolicy'}",
        ),
        _m(
            "old-layers-path-silent",
            "importing the 0.1 path shardcore.layers no longer warns (a plugin author never hears of the move)",
            "shardcore/layers/__init__.py",
            ("    DeprecationWarning,\n    stacklevel=2,\n)", "    PendingDeprecationWarning,\n    stacklevel=2,\n)"),
            "tests/test_core_moved_imports.py::test_the_old_package_warns_naming_the_new_import_and_every_old_module_is_the_new_code",
            "importing shardcore.layers gave the DeprecationWarnings []",
            fast=True,
        ),
        _m(
            "cost-attention-heads-not-split",
            "the cost model counts every attention head on each tensor-parallel rank",
            "shardcore/cost/facts.py",
            (
                "    return max(1, heads // tp) if heads else 0, dim, causal",
                "    return max(1, heads) if heads else 0, dim, causal",
            ),
            f"{LLAMA}/test_llama_auto.py::test_the_cost_facts_split_a_llama_s_bytes_and_matmul_weights_by_stage_as_counted_by_name",
            "attention facts (4, 16, True)",
        ),
        _m(
            "mlp-inputs-each-copied",
            "an MLP's gate and up projections (one input) each all-reduce their input's gradient",
            "shardcore/builders.py",
            ('    kw = {"copy_input": not shared_input}', '    kw = {"copy_input": True}'),
            f"{LLAMA}/test_llama_tp.py::test_collectives_per_step[1-False]",
            "backward collectives {'all_reduce': 5}",
        ),
        _m(
            "checkpoint-shape-unchecked",
            "a checkpoint tensor whose shape is not the model's is read without a word before any slice",
            "shardcore/checkpoint/hf.py",
            (
                "        saved = handles[files[key]].shape(key)\n        if saved != _full_shape(tensor, spec):",
                "        saved = handles[files[key]].shape(key)\n        if False:",
            ),
            "tests/test_core_checkpoint.py::test_bad_checkpoints_fail_clearly_on_every_rank",
            "('wrong', ['no error', 'no error'])",
        ),
        _m(
            "explain-stage-bytes-all-on-the-first",
            "explain --pp puts everything outside the blocks (final norm, head) on the first stage",
            "shardcore/explain/counts.py",
            ("            stage = pp - 1 if seen_block else 0", "            stage = 0"),
            f"{LLAMA}/test_llama_auto.py::test_the_cost_facts_split_a_llama_s_bytes_and_matmul_weights_by_stage_as_counted_by_name",
            "explain --pp 2 says the stages hold",
            fast=True,
        ),
        _m(
            "parallelize-takes-attentions",
            "parallelize accepts output_attentions=True, whose attention weights each worker holds for its own heads only",
            "shardcore/inference/__init__.py",
            ('        if kwargs.get("output_attentions"):', "        if False:"),
            "tests/test_core_parallelize.py::test_refuses_split_outputs",
            "FlakyLM.forward() got an unexpected keyword argument 'output_attentions'",
            fast=True,
        ),
        _m(
            "kit-clips-with-the-2-norm",
            "the clipping check's user line clips with the 2-norm whatever norm type the test asks",
            "shardcore/testing/clipping.py",
            (
                "        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=norm_type)",
                "        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=2.0)",
            ),
            f"{LLAMA}/test_llama_clipping.py::test_other_norms[inf]",
            "clip_grad_norm_ (torch, norm_type=inf) on rank 1: norm 3.34",
        ),
        _m(
            "kit-every-rank-trains-on-part-zero",
            "the data-parallel check gives every data-parallel rank the batch's first part",
            "shardcore/testing/data_parallel.py",
            ("            value = value.chunk(dp_size)[dp_rank]", "            value = value.chunk(dp_size)[0]"),
            f"{LLAMA}/test_llama_data_parallel.py::test_trains_like_unsharded_full_batch[ddp2xtp2]",
            "mean loss over the data-parallel ranks 6.903",
        ),
        _m(
            "kit-checkpoints-compared-by-shape",
            "the checkpoint comparison looks at each tensor's shape, not its values",
            "shardcore/testing/checkpoints.py",
            (
                "        if got[name].shape != tensor.shape or not torch.equal(got[name], tensor):",
                "        if got[name].shape != tensor.shape:",
            ),
            "tests/test_core_kit_selftest.py::test_the_checkpoint_comparison_fails_on_one_changed_value",
            "the checkpoint comparison refused 'nothing (the check passed)'",
        ),
        _m(
            "kit-pipeline-compares-weights-with-gradients",
            "the pipeline check gathers the weights where it means the gradients",
            "shardcore/testing/pipeline.py",
            (
                "    pairs = [(n, g, ref_grads[n]) for n, g in shardcore.full_named_tensors(model, grads=True)]",
                "    pairs = [(n, g, ref_grads[n]) for n, g in shardcore.full_named_tensors(model, grads=False)]",
            ),
            "plugins/shard-gpt2/tests/test_gpt2_pipeline.py::test_pipeline_trains_like_unsharded[2-1-GPipe]",
            "gradient of transformer.h.2.ln_1.weight (held, gathered over tp)",
        ),
        _m(
            "loss-ignores-num-items",
            "the vocab-parallel causal-LM loss drops num_items_in_batch: a token-weighted loss over data-parallel parts is each part's mean",
            "shardcore/losses.py",
            ("        num_items_in_batch=num_items_in_batch,\n    )\n", "        num_items_in_batch=None,\n    )\n"),
            f"{LLAMA}/test_llama_data_parallel.py::test_uneven_label_counts_train_like_the_whole_batch_with_the_token_weighted_loss[ddp-2-2]",
            "token-weighted loss under ddp: gradients off by",
        ),
        _m(
            "loss-counts-padding-tokens",
            "a token loss's count includes the -100 (ignored) labels: a pipeline's padded microbatches are scaled down",
            "shardcore/losses.py",
            ("    return (labels != -100).sum()", "    return torch.tensor(labels.numel())"),
            "plugins/shard-bert/tests/test_bert_pipeline.py::test_pipeline_trains_like_unsharded[mlm-gpipe]",
            "pipeline_step loss 1.1327",
        ),
        _m(
            "stale-profile-read",
            "a cached machine profile of another shardcore version is read as current",
            "shardcore/cost/profile.py",
            ('        if cached.get("version") == VERSION:', "        if True:"),
            "tests/test_core_cost.py::test_a_profile_of_another_version_is_not_read",
            "a profile of version -1 gave 'nothing (the stale profile was read)'",
        ),
        _m(
            "cli-plugins-exit-zero-on-a-broken-plugin",
            "`shardcore plugins` exits 0 while a plugin cannot be imported (a CI check of the install passes)",
            "shardcore/cli.py",
            ('    failed = 1 if any(r["error"] for r in rows) else 0', "    failed = 0"),
            "tests/test_core_plugins.py::test_cli_table_and_json",
            "shardcore plugins exited 0 with a plugin that cannot be imported",
        ),
        _m(
            "device-audit-on-the-cpu",
            "the device-strict audit leaves the default device alone: a buffer made without a device lands on the CPU unseen",
            "shardcore/testing/syncs.py",
            ('        with torch.device("meta"):', "        with contextlib.nullcontext():"),
            "tests/test_core_sync.py::test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device",
            "'device': 'cpu'",
        ),
        _m(
            "colwise-style-read-as-rowwise",
            "a plan's colwise style on a plain linear weight becomes a row split",
            "shardcore/plan/styles.py",
            (
                '        return ["tp", None] if column else [None, "tp"]',
                '        return [None, "tp"] if column else [None, "tp"]',
            ),
            "tests/test_core_plan.py::test_a_plan_s_style_names_become_the_specs_its_table_gives",
            "the styles became {('weight', 'colwise'): [None, 'tp']",
        ),
        _m(
            "explain-import-error-escapes",
            "explain given a module that cannot be imported ends in a traceback instead of naming the spec",
            "shardcore/explain/__init__.py",
            ("        except (ImportError, AttributeError) as err:", "        except AttributeError as err:"),
            f"{LLAMA}/test_llama_kernels.py::test_explain_table_and_bad_spec",
            "No module named 'no_such_module'",
        ),
        _m(
            "served-cache-handed-back",
            "parallelize returns rank 0's KV cache (its own heads only) with the outputs",
            "shardcore/inference/served.py",
            ('    "past_key_values",\n    "cache",\n)', ")"),
            f"{LLAMA}/test_llama_parallelize.py::test_forward_and_generate_match_unsharded[module]",
            "parallelize handed back rank 0's cache of its own heads",
        ),
        _m(
            "dit-heads-not-per-rank",
            "shard-diffusers leaves each attention's head count whole: the processor reshapes a rank's slice into every head",
            "plugins/shard-diffusers/shard_diffusers/policy.py",
            ('                attribute_replacement={f"{a}.heads": heads // tp for a in attentions},\n', ""),
            "plugins/shard-diffusers/tests/test_diffusers_tp.py::test_matches_unsharded[DiTTransformer2DModel-2]",
            "output 'sample': max abs diff",
        ),
        _m(
            "exit-works-not-kept",
            "the works of shardcore's last collectives are not kept: a worker thread may destroy one at exit",
            "shardcore/distributed/retain.py",
            (
                "        _KEPT.setdefault(group_key(group), collections.deque(maxlen=KEEP)).append(work)\n",
                "        pass\n",
            ),
            "tests/test_core_exit.py::test_the_last_works_of_each_group_are_kept_and_bounded",
            "kept works per group: [0, 0",
        ),
        _m(
            "exit-works-kept-forever",
            "every work shardcore waits for is kept, not the last few per group: memory grows with the steps",
            "shardcore/distributed/retain.py",
            ("collections.deque(maxlen=KEEP)", "collections.deque()"),
            f"{LLAMA}/test_llama_long_run.py::test_a_long_run_stays_flat[tp2]",
            "resident memory grew",
        ),
        _m(
            "watch-thread-not-joined-at-exit",
            "the watch's thread is left running into the interpreter's finalization (no exit hook)",
            "shardcore/distributed/watch.py",
            ("                atexit.register(self.stop)\n", "                pass\n"),
            "tests/test_core_exit.py::test_the_watch_s_thread_is_joined_before_the_interpreter_finalizes",
            "the watch's exit hook is not registered once",
        ),
        _m(
            "exit-groups-not-settled",
            "the exit hook settles no gloo group: the script's and FSDP's last works are left to the worker threads",
            "shardcore/distributed/retain.py",
            ("    for group in _gloo_groups():\n", "    for group in []:\n"),
            "tests/test_core_exit.py::test_the_exit_hook_settles_every_gloo_group_with_a_kept_barrier",
            "the exit barrier settled {'settled': 0",
        ),
        # -- the policy contract: one declared spec per parallelism, merged once for composites ------
        _m(
            "spec-grad-sum-parts-dropped",
            "a composite's gradient sums keep only its own declaration, not its parts' (their norms left at one rank's share)",
            "shardcore/spec/parallel.py",
            (
                "            grad_sum=(*own.grad_sum, *(under(path, n) for path, p in parts.items() for n in p.grad_sum)),",
                "            grad_sum=own.grad_sum,",
            ),
            f"{SPEC}::test_a_composite_merges_tensor_parallel_from_its_parts",
            "not the tower's norm under its path",
            fast=True,
        ),
        _m(
            "spec-fusible-not-under-part",
            "a composite's fused modules named as inside their part, not from the whole model (compiled at the wrong path)",
            "shardcore/spec/model.py",
            ("            fusible=(*own.fusible, *((under(path, n), m)", "            fusible=(*own.fusible, *((n, m)"),
            f"{SPEC}::test_a_composite_merges_kernels_from_its_parts",
            "not named from the whole model",
        ),
        _m(
            "spec-part-asked-in-whole-names",
            "a part's checkpoint names asked with the whole model's names, not its own (its renames never match)",
            "shardcore/spec/under.py",
            (
                '    return name[len(path) + 1 :] if name.startswith(f"{path}.") else None',
                '    return name if name.startswith(f"{path}.") else None',
            ),
            f"{SPEC}::test_a_composite_merges_checkpoints_from_its_parts",
            "a part asked in the whole model's names",
        ),
        _m(
            "spec-pipeline-from-a-part",
            "a composite runs its first part's pipeline as its own (the parts' forwards are not the composite's)",
            "shardcore/spec/pipeline.py",
            ("        return own\n", "        return own or next(iter(parts.values()), None)\n"),
            f"{SPEC}::test_a_composite_pipeline_is_its_own_only",
            "the parts' pipelines cannot be joined",
        ),
        _m(
            "spec-sequence-from-a-part",
            "a composite runs its first part's sequence modes as its own",
            "shardcore/spec/sequence.py",
            ("        return own\n", "        return next(iter(parts.values()), own)\n"),
            f"{SPEC}::test_a_composite_sequence_is_its_own_only",
            "the composite took a part's sequence modes as its own",
        ),
        _m(
            "spec-legacy-silent",
            "a policy written on 0.x's members is read without the DeprecationWarning naming the new spelling",
            "shardcore/spec/legacy.py",
            ("    if mine:\n", "    if False:\n"),
            f"{SPEC}::test_a_policy_written_on_0x_members_warns_once_naming_the_new_spelling",
            "DeprecationWarnings for a 0.x policy class, not one",
        ),
        _m(
            "spec-attention-registry-unset",
            "the model library's attention registry is never registered (every attention switch refused)",
            "shardcore/spec/attention.py",
            ("    _REGISTRY[:] = [registry]\n", "    pass\n"),
            f"{SPEC}::test_a_sequence_spec_is_read_with_its_defaults",
            "no model library's attention registry is registered",
        ),
        _m(
            "spec-sequence-regions-ignored",
            "split_gather splits over every block, ignoring the regions the spec declares (Whisper's decoder split)",
            "shardcore/sequence/declared.py",
            (
                "    return [list(r) for r in found] if found is not None else [policy.blocks()]",
                "    return [policy.blocks()]",
            ),
            f"{SPEC}::test_a_sequence_spec_is_read_with_its_defaults",
            "not the declared [['blocks.0']]",
        ),
        _m(
            "plugin-api-old-hooks-silent",
            "0.x's hook bases load from shardcore.plugin_api without the DeprecationWarning naming the spec",
            "shardcore/plugin_api.py",
            ("        warnings.warn(\n", "        (lambda *a, **k: None)(\n"),
            f"{SPEC}::test_the_old_hook_bases_warn_from_the_plugin_api",
            "DID NOT WARN",
        ),
        _m(
            "hf-kv-heads-as-heads",
            "attention_dims reads a GQA config's key/value heads as many as its query heads",
            "shardcore/integrations/hf/heads.py",
            ('    kv = getattr(config, "num_key_value_heads", None) or heads\n', "    kv = heads\n"),
            f"{LLAMA}/test_llama_tp.py::test_causal_lm_variants[gqa-2]",
            "expected size 64 along dim 0, got shape (32, 64)",
        ),
        _m(
            "bloom-alibi-whole",
            "shard-bloom: ALiBi's bias for every head reaches each rank's attention over its own heads",
            "plugins/shard-bloom/shard_bloom/policy.py",
            (
                'heads_of_this_rank("self_attention", "query_key_value", ("alibi",))',
                'heads_of_this_rank("self_attention", "query_key_value", ())',
            ),
            "plugins/shard-bloom/tests/test_bloom_tp.py::test_matches_unsharded[causal-tp2]",
            "must match the existing size (8) at non-singleton dimension 0",
        ),
        # -- every plugin's registration (the entry point's one computing line) -------------------
        *[
            _m(
                f"{name}-registers-nothing",
                f"shard-{name}'s hook registers no model: its models fall to zero-config or are refused",
                f"plugins/shard-{name}/shard_{name}/__init__.py",
                ("    register(MODELS)", "    register({})"),
                test,
                expect,
            )
            for name, test, expect in [
                (
                    "bert",
                    "plugins/shard-bert/tests/test_bert_tp.py::test_bert_classes[BertModel-2]",
                    "covers transformers.models.bert.modeling_bert.BertModel",
                ),
                (
                    "diffusers",
                    "plugins/shard-diffusers/tests/test_diffusers_tp.py::test_matches_unsharded[DiTTransformer2DModel-2]",
                    "covers diffusers.models.transformers.dit_transformer_2d.DiTTransformer2DModel",
                ),
                (
                    "blip2",
                    "plugins/shard-blip2/tests/test_blip2_tp.py::test_matches_unsharded[opt-tp2]",
                    "covers transformers.models.blip_2.modeling_blip_2.Blip2ForConditionalGeneration",
                ),
                (
                    "bloom",
                    "plugins/shard-bloom/tests/test_bloom_tp.py::test_matches_unsharded[causal-tp2]",
                    "covers transformers.models.bloom.modeling_bloom.BloomForCausalLM",
                ),
                (
                    "clip",
                    "plugins/shard-clip/tests/test_clip_tp.py::test_matches_unsharded[clip-tp2]",
                    "covers transformers.models.clip.modeling_clip.CLIPModel",
                ),
                (
                    "falcon",
                    "plugins/shard-falcon/tests/test_falcon_tp.py::test_matches_unsharded[alibi-tp2]",
                    "covers transformers.models.falcon.modeling_falcon.FalconForCausalLM",
                ),
                (
                    "glm",
                    "tests/test_core_plugins.py::test_each_bundled_plugin_covers_its_models[glm]",
                    "shard-glm's hook left",
                ),
                (
                    "gpt2",
                    "plugins/shard-gpt2/tests/test_gpt2_tp.py::test_matches_unsharded[GPT2LMHeadModel-2]",
                    "covers transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel",
                ),
                (
                    "llama",
                    "tests/test_core_plugins.py::test_each_bundled_plugin_covers_its_models[llama]",
                    "shard-llama's hook left",
                ),
                (
                    "llava",
                    "plugins/shard-llava/tests/test_llava_tp.py::test_matches_unsharded[2]",
                    "'PlanPolicy' object has no attribute 'part_policies'",
                ),
                (
                    "moe",
                    "tests/test_core_plugins.py::test_each_bundled_plugin_covers_its_models[moe]",
                    "shard-moe's hook left",
                ),
                (
                    "opt",
                    "plugins/shard-opt/tests/test_opt_tp.py::test_matches_unsharded[causal-tp2]",
                    "covers transformers.models.opt.modeling_opt.OPTForCausalLM",
                ),
                (
                    "sam",
                    "plugins/shard-sam/tests/test_sam_tp.py::test_matches_unsharded[rel-pos-tp2]",
                    "covers transformers.models.sam.modeling_sam.SamModel",
                ),
                (
                    "t5",
                    "plugins/shard-t5/tests/test_t5_tp.py::test_matches_unsharded[t5-tp2]",
                    "covers transformers.models.t5.modeling_t5.T5ForConditionalGeneration",
                ),
                (
                    "vit",
                    "plugins/shard-vit/tests/test_vit_hf.py::test_hf_vit_classes[ViTModel-2]",
                    "covers transformers.models.vit.modeling_vit.ViTModel",
                ),
                (
                    "whisper",
                    "plugins/shard-whisper/tests/test_whisper_tp.py::test_whisper_classes[WhisperModel-2]",
                    "covers transformers.models.whisper.modeling_whisper.WhisperModel",
                ),
            ]
        ],
    ]
}


def _copy() -> pathlib.Path:
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="shardcore-mutant-"))
    ignore = shutil.ignore_patterns(".nox", ".git", "__pycache__", "bench-results", "*.egg-info", ".ruff_cache")
    for name in ("shardcore", "plugins", "tests", "examples", "benchmarks", "pyproject.toml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(
            src, scratch / name, **({"ignore": ignore} if src.is_dir() else {})
        )
    return scratch


def _run(
    scratch: pathlib.Path, tests: list[str], timeout: float = TIMEOUT_S
) -> tuple[int | None, str, float, dict[str, str]]:
    """Run ``tests`` in ``scratch`` within ``timeout`` seconds: ``(exit code or None on a time-out,
    output, seconds, {failed test: its failure report})``. Asserts run plain (their own message, no
    rewritten expression) and the reports come from ``tests/mutant_report.py``: the exceptions'
    text, no source line."""
    plugins = [str(p) for p in sorted((scratch / "plugins").iterdir()) if (p / "pyproject.toml").is_file()]
    path = os.pathsep.join([str(scratch), *plugins, str(scratch / "tests")])
    report = scratch / "failure-reports.json"
    report.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": "0", "SHARDCORE_MUTANT_REPORT": str(report)}
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", "-p", "mutant_report"]
    cmd += ["--assert=plain", *tests]
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", time.perf_counter() - start, {}
    reports = json.loads(report.read_text()) if report.is_file() else {}
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start, reports


def _outcome(mutant: Mutant, code: int | None, reports: dict[str, str]) -> str:
    """``caught`` only when the declared test failed and its failure report (the exception's text,
    not the test's source, not pytest's other output) holds the declared message."""
    if code is None:
        return f"not caught: time-out after {TIMEOUT_S} s (a hang)"
    if code == 0:
        return "not caught: the test passed"
    mine = [text for test, text in reports.items() if test == mutant.test or test.startswith(mutant.test + "[")]
    if code != 1 or not mine:
        return f"not caught: pytest exit {code} without the declared test failing"
    if not any(mutant.expect in text for text in mine):
        return f"not caught: {mutant.test} failed, but its report lacks {mutant.expect!r}"
    return "caught"


def vague(mutant: Mutant) -> str | None:
    """Why ``mutant``'s declared message could match a failure other than its own (``None``: it
    cannot): a bare exception name, or a fragment too short to say which check failed."""
    if re.fullmatch(r"\w*(Error|Exception|Timeout|Lost)", mutant.expect):
        return f"{mutant.name}: {mutant.expect!r} is a bare exception name, any failure of the test says it"
    if len(mutant.expect) < 12:
        return f"{mutant.name}: {mutant.expect!r} is too short to name one failure"
    return None


def apply(mutant: Mutant, text: str) -> str:
    """``text`` with the mutant's edits; each snippet must occur exactly once."""
    for snippet, replacement in mutant.edits:
        if text.count(snippet) != 1:
            raise SystemExit(f"mutant {mutant.name}: a snippet occurs {text.count(snippet)} times in {mutant.file}")
        text = text.replace(snippet, replacement)
    return text


def area(file: str) -> str:
    """The part of the code a source file belongs to: a core subpackage or top-level module
    (``tensor_parallel``, ``grad_norm``), or a plugin (``shard-llama``)."""
    parts = file.split("/")
    if parts[0] == "plugins":
        return parts[1]
    return parts[1] if len(parts) > 2 else parts[1].removesuffix(".py")


def _computes(function) -> bool:
    """Whether a function's body does more than declare: a docstring, ``pass``, ``...``, returning a
    literal or raising (a hook specification, a contract's default) compute nothing."""
    import ast

    def declares(node) -> bool:
        if isinstance(node, ast.Pass | ast.Raise):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return True  # a docstring or ...
        if isinstance(node, ast.Return):  # nothing, or a literal naming and calling nothing
            return node.value is None or not any(
                isinstance(n, ast.Name | ast.Call | ast.Attribute) for n in ast.walk(node.value)
            )
        return False

    return not all(declares(node) for node in function.body)


def computing_files() -> list[str]:
    """The source files of the core and the plugins' packages that define a function that computes
    something (:func:`_computes`), rather than only import, declare or re-export."""
    import ast

    files = sorted([*ROOT.glob("shardcore/**/*.py"), *ROOT.glob("plugins/shard-*/shard_*/**/*.py")])
    return [
        p.relative_to(ROOT).as_posix()
        for p in files
        if any(
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and _computes(n)
            for n in ast.walk(ast.parse(p.read_text()))
        )
    ]


def uncovered() -> list[str]:
    """The computing source files no mutant mutates."""
    covered = {m.file for m in MUTANTS.values()}
    return [f for f in computing_files() if f not in covered]


def per_area(record: dict) -> str:
    """``area: caught/total`` for each part of the code, from a run's record."""
    counts: dict[str, list[int]] = {}
    for r in record["mutants"]:
        c = counts.setdefault(area(r["file"]), [0, 0])
        c[0] += r["outcome"] == "caught"
        c[1] += 1
    return ", ".join(f"{a} {c}/{t}" for a, (c, t) in sorted(counts.items()))


def readme_table(record: dict) -> str:
    """The score line and table docs/plugins.md quotes, from a full run's record (``docs/mutants.json``)."""
    lines = [
        f"**{record['caught']}/{record['total']} caught by their declared check**.",
        "",
        f"By part of the code: {per_area(record)}.",
        "",
        "| mutant | the bug | declared check (test, message) | outcome |",
        "|---|---|---|---|",
    ]
    for r in record["mutants"]:
        m = MUTANTS[r["mutant"]]
        lines.append(f"| `{m.name}` | {m.bug} | `{pathlib.Path(m.test).name}`, {m.expect!r} | {r['outcome']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="only the mutants CI runs")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the unmutated run of the declared tests (CI: the whole suite passed just before)",
    )
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    chosen = [MUTANTS[n] for n in args.names] if args.names else list(MUTANTS.values())
    chosen = [m for m in chosen if m.fast or not args.fast]
    scratch = _copy()
    results = []
    try:
        code, output, seconds = 0, "", 0.0
        if not args.no_baseline:
            tests = sorted({m.test for m in chosen})  # each test the bound one mutant's run has
            code, output, seconds, _ = _run(scratch, tests, timeout=TIMEOUT_S * len(tests))
            print(f"baseline (no mutant): pytest exit {code} in {seconds:.0f} s")
        if code != 0:
            print(output[-3000:])
            print("the unmutated tests must pass first")
            return 2
        for mutant in chosen:
            target = scratch / mutant.file
            original = target.read_text()
            target.write_text(apply(mutant, original))
            try:
                code, output, seconds, reports = _run(scratch, [mutant.test])
            finally:
                target.write_text(original)
            outcome = _outcome(mutant, code, reports)
            results.append(
                {
                    "mutant": mutant.name,
                    "bug": mutant.bug,
                    "file": mutant.file,
                    "declared_check": f"{mutant.test} ({mutant.expect!r})",
                    "outcome": outcome,
                    "seconds": round(seconds, 1),
                }
            )
            print(f"{seconds:5.0f} s  {mutant.name}: {outcome}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    caught = sum(r["outcome"] == "caught" for r in results)
    print(f"mutation score: {caught}/{len(results)} caught by their declared check")
    print(f"by part of the code: {per_area({'mutants': results})}")
    missing = uncovered()
    print(f"computing source files without a mutant: {len(missing)} of {len(computing_files())}")
    full = not args.fast and not args.names
    out = ROOT / ("docs/mutants.json" if full else "bench-results/mutants-fast.json")
    out.parent.mkdir(exist_ok=True)
    record = {"caught": caught, "total": len(results), "mutants": results}
    out.write_text(json.dumps(record, indent=2) + "\n")
    if full:  # docs/plugins.md quotes the committed record (tests/test_core_mutants.py checks it)
        print("\nthe table for docs/plugins.md:\n\n" + readme_table(record))
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
