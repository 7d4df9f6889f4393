"""Mutants of checkpoint: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "dcp-wrong-rows",
        "load_distributed assembling a rank's slice with its rows reversed",
        "shardcore/checkpoint/dcp.py",
        "_assemble",
        [
            (
                "    return torch.cat(pieces, dim=spec.dim)\n",
                "    return torch.cat(pieces, dim=spec.dim).flip(spec.dim)\n",
            )
        ],
        "tests/test_core_dcp.py::test_save_at_tp2_resume_at_other_tp[4]",
        "after resuming: max abs diff",
    ),
    m(
        "kv-replica-slice-on-hf-load",
        "load_checkpoint reading a replicated KV head for rank r as head r % heads (interleaved) instead of r // replicas (blocked, as the layers hold it)",
        "shardcore/checkpoint/safetensors_io.py",
        "SafetensorsFile.read",
        [
            (
                "        return self.read_rows(key, spec.dim, spec.ranges(rank), dtype)\n",
                "        n = spec.segments[0].num_shards\n"
                "        rank = (rank % n) * (spec.tp_size // n) if spec.is_replicated else rank\n"
                "        return self.read_rows(key, spec.dim, spec.ranges(rank), dtype)\n",
            )
        ],
        "tests/integration/test_llama_checkpoint.py::test_meta_load_then_save_round_trip[4]",
        "after lazy load: max abs diff",
    ),
    m(
        "save-gathers-rows-reversed",
        "save_checkpoint (behind save_pretrained) writing a split tensor's rows in reverse",
        "shardcore/checkpoint/hf_save.py",
        "save_checkpoint",
        [
            (
                "                full = local if spec is None else spec.gather(local, pg)",
                "                full = local if spec is None else spec.gather(local, pg).flip(0)",
            )
        ],
        "tests/integration/test_llama_save_pretrained.py::test_save_pretrained_loads_unsharded[tp2]",
        "loaded from save_pretrained differs from the unsharded model",
    ),
    m(
        "checkpoint-parts-first-rows",
        "load_checkpoint: every rank reads the first experts' pieces of a tensor kept in pieces",
        "shardcore/checkpoint/parts.py",
        "StackedParts.read",
        [
            (
                "                    out[at + i - start] = self._entry(i, read_rows, shape_of, dtype)",
                "                    out[at + i - start] = self._entry(i - start, read_rows, shape_of, dtype)",
            )
        ],
        "plugins/shard-moe/tests/test_moe_workflow.py::test_checkpoint_in_per_expert_layout_read_on_shard[mixtral]",
        "after lazy load: max abs diff",
    ),
    m(
        "stale-checkpoint-files-kept",
        "save_checkpoint over an earlier checkpoint leaves its files (a stale index is read first)",
        "shardcore/checkpoint/hf_save.py",
        "_replace",
        [("        if old != marker:\n            old.unlink()\n", "        pass\n")],
        "tests/test_core_checkpoint_safety.py::test_a_save_over_an_earlier_checkpoint_replaces_it_wholly[many-then-one]",
        "the load returned the earlier checkpoint's weights",
        fast=True,
    ),
    m(
        "dcp-save-in-place",
        "save_distributed writes over the earlier checkpoint's files in place (no staging, no swap)",
        "shardcore/checkpoint/dcp.py",
        "save_distributed",
        [
            ("    dcp.save(state, checkpoint_id=str(staging))", "    dcp.save(state, checkpoint_id=str(path))"),
            ("        atomic.finish(path, staging)", "        pass"),
        ],
        "tests/test_core_checkpoint_crash.py::test_a_rank_killed_inside_a_dcp_save_leaves_the_earlier_checkpoint",
        "the earlier DCP checkpoint changed",
    ),
    m(
        "safetensors-header-trusted",
        "a safetensors header read as it says: a dtype or shape that does not fit its bytes reinterprets them",
        "shardcore/checkpoint/safetensors_io.py",
        "_entry",
        [("    if stop - begin != nbytes:", "    if False:")],
        "tests/test_core_bad_input.py::test_a_damaged_checkpoint_is_refused_by_name_on_every_rank_before_any_collective[header-lies-about-dtype]",
        "the header-lies-about-dtype checkpoint: loaded",
    ),
    m(
        "materialize-buffers-not-computed",
        "buffers left on meta by a meta build are filled but never computed by the policy",
        "shardcore/checkpoint/materialize.py",
        "materialize_buffers",
        [("        _compute_buffers(model, policy, owners)\n", "        pass\n")],
        "tests/integration/test_llama_checkpoint.py::test_torch_meta_device_build_computes_buffers_or_refuses",
        "the buffers ['model.rotary_emb.inv_freq', 'model.rotary_emb.original_inv_freq'] are not in the checkpoint",
    ),
    m(
        "atomic-interrupted-swap-unnamed",
        "a distributed checkpoint whose save died between the two renames is refused as missing, not naming where the earlier one is",
        "shardcore/checkpoint/atomic.py",
        "check",
        [
            (
                "        if old.exists():\n            raise CheckpointError(",
                "        if False:\n            raise CheckpointError(",
            )
        ],
        "tests/test_core_checkpoint_crash.py::test_a_writer_killed_between_the_renames_is_refused_naming_the_earlier_checkpoint",
        Raised(
            "AssertionError",
            "tests/test_core_checkpoint_crash.py::test_a_writer_killed_between_the_renames_is_refused_naming_the_earlier_checkpoint",
        ),
    ),
    m(
        "checkpoint-shape-unchecked",
        "a checkpoint tensor whose shape is not the model's is read without a word before any slice",
        "shardcore/checkpoint/hf.py",
        "_shape_problems",
        [
            (
                "        saved = handles[files[key]].shape(key)\n        if saved != _full_shape(tensor, spec):",
                "        saved = handles[files[key]].shape(key)\n        if False:",
            )
        ],
        "tests/test_core_checkpoint.py::test_bad_checkpoints_fail_clearly_on_every_rank",
        "('wrong', ['no error', 'no error'])",
    ),
    m(
        "stacked-parts-read-whole",
        "load_checkpoint reads every piece of a stacked tensor whole and keeps its slice: a rank reads all "
        "the experts' bytes",
        "shardcore/checkpoint/parts.py",
        "StackedParts._entry",
        [
            (
                "                parts.append(read_rows(key, dim, [(*span, 0)], dtype))",
                "                parts.append(read_rows(key, 0, [(0, shape_of(key)[0], 0)], dtype).narrow(dim, span[0], span[1] - span[0]))",
            )
        ],
        "tests/test_core_recent_families.py::test_a_hub_layout_moe_checkpoint_is_read_on_shard",
        "'expert_bytes': 65536}, 98304",
    ),
    m(
        "library-parts-sources-swapped",
        "a fused tensor's pieces concatenated against the converter's order (up projection before the gate)",
        "shardcore/checkpoint/library.py",
        "library_parts",
        [
            (
                "            keys_of = tuple(tuple(pieces[name][s, i] for s in range(sources)) for i in indices)",
                "            keys_of = tuple(tuple(pieces[name][s, i] for s in reversed(range(sources))) for i in indices)",
            )
        ],
        "tests/test_core_recent_families.py::test_a_hub_layout_moe_checkpoint_is_read_on_shard",
        "after lazy load",
    ),
    m(
        "dcp-state-dict-api-let-through",
        "torch.distributed.checkpoint's state-dict API (Lightning's fabric.save) takes a sharded model's state dict: "
        "one rank's slice of each split parameter kept, the others lost, no error",
        "shardcore/checkpoint/foreign.py",
        "refuse_foreign_state_dicts",
        [("            if split:\n", "            if False:\n")],
        "tests/test_core_dcp.py::test_dcps_state_dict_api_on_split_parameters_is_refused_by_name[2]",
        "'message': 'no error: ",
    ),
]
