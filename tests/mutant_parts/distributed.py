"""Mutants of distributed: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "traced-reduce-takes-the-max",
        "the compiled all-reduce takes the largest partial sum instead of adding them: a compiled row-parallel layer is wrong",
        "shardcore/distributed/traced.py",
        "all_reduce",
        [('funcol.all_reduce(x, "sum", group)', 'funcol.all_reduce(x, "max", group)')],
        "tests/test_core_compile.py::test_a_compiled_tensor_parallel_block_is_one_graph_with_its_collectives_in_it",
        "the compiled block's output differs from the eager one's",
    ),
    m(
        "groups-keep-nccl-s-default-timeout",
        "the groups shardcore creates on NCCL keep NCCL's 10-minute timeout, not twice the model's bound",
        "shardcore/distributed/groups.py",
        "new_group",
        [("    return dist.new_group(ranks, timeout=group_timeout())", "    return dist.new_group(ranks)")],
        "tests/test_core_devices.py::test_the_groups_shardcore_creates_on_nccl_wait_twice_the_bound[nccl-14.0]",
        "the group's timeout",
    ),
    m(
        "mesh-groups-keep-nccl-s-default-timeout",
        "the layout's device mesh is built without the timeout in NCCL's options",
        "shardcore/distributed/groups.py",
        "mesh_backend_override",
        [("        options._timeout = timeout\n", "")],
        "tests/test_core_devices.py::test_the_groups_shardcore_creates_on_nccl_wait_twice_the_bound[cpu:gloo,cuda:nccl-14.0]",
        "the mesh's groups would not wait twice the bound",
    ),
    m(
        "cpu-mesh-under-cpu-gloo-cuda-nccl",
        "the layout's mesh is a CPU mesh under init_from_env's cpu:gloo,cuda:nccl (FSDP2 would keep shards on the CPU)",
        "shardcore/distributed/groups.py",
        "mesh_device",
        [('"nccl" in backends().values() and torch.cuda.is_available()', 'dist.get_backend() == "nccl"')],
        "tests/test_core_devices.py::test_the_meshes_shardcore_builds_are_on_the_gpu_when_the_world_runs_nccl[cpu:gloo,cuda:nccl-cuda]",
        "a cpu mesh on a world running cpu:gloo,cuda:nccl",
    ),
    m(
        "flight-recorder-overrides-the-user",
        "shardcore's flight-recorder defaults overwrite the NCCL variables the user set",
        "shardcore/distributed/watch.py",
        "use_flight_recorder",
        [("        os.environ.setdefault(name, value)", "        os.environ[name] = value")],
        "tests/test_core_devices.py::test_the_group_shardcore_starts_on_a_gpu_has_nccl_s_flight_recorder_on[True]",
        "the flight recorder's variables when NCCL starts",
    ),
    m(
        "counts-not-per-model",
        "collectives counted for the process only, not for the model that issued them",
        "shardcore/distributed/scope.py",
        "_count",
        [("    if scope is not DEFAULT_SCOPE:\n", "    if False:\n")],
        "tests/test_core_consistency.py::test_each_model_counts_its_own_collectives",
        "_counts_per_model failed",
    ),
    m(
        "backward-bound-of-the-process",
        "a backward collective waits with the bound of whatever runs now, not of the model that recorded it",
        "shardcore/distributed/collectives.py",
        "_wait",
        [("    scope = _scope(where)\n    where = where or", "    scope = current_scope()\n    where = where or")],
        "tests/test_core_consistency.py::test_a_collective_only_some_ranks_call_raises_within_the_bound[backward-later-model-False-(backward of ]",
        Raised(
            "AssertionError",
            "tests/test_core_consistency.py::test_a_collective_only_some_ranks_call_raises_within_the_bound",
        ),
    ),
    m(
        "nccl-wait-blocks-host",
        "on NCCL every collective is waited for with a timeout again: a host sync per all-reduce",
        "shardcore/distributed/collectives.py",
        "_wait_on_stream",
        [
            (
                "    try:\n        work.wait()\n",
                "    try:\n        work.wait(timeout=timedelta(seconds=bound))\n",
            )
        ],
        "tests/integration/test_llama_sync_audit.py::test_a_steady_training_step_makes_no_host_sync[default]",
        "'wait(timeout)', 'shardcore/distributed/collectives.py', '_wait_on_stream'",
    ),
    m(
        "gloo-gather-slices-misordered",
        "on gloo a gather along a later dimension writes each rank's part into another rank's slice",
        "shardcore/distributed/collectives.py",
        "start_all_gather",
        [
            (
                "out.narrow(dim, r * n, n) for r in range(world)",
                "out.narrow(dim, (world - 1 - r) * n, n) for r in range(world)",
            )
        ],
        "tests/test_core_sync.py::test_tensor_collectives_match_lists_and_cat_along_every_dimension",
        "all-gather along 1",
    ),
    m(
        "watch-silent",
        "a collective that outlives its bound on NCCL is never named (the watch does not report)",
        "shardcore/distributed/watch.py",
        "Watch.check",
        [("        REPORTS.append(message)\n", "")],
        "tests/test_core_sync.py::test_a_hang_on_a_watchdog_backend_is_named_at_the_bound",
        "not enough values to unpack (expected 1, got 0)",
    ),
    m(
        "restart-on-the-shared-store",
        "a job torchrun restarted joins its group on the store keys the dead attempt left",
        "shardcore/distributed/__init__.py",
        "_restart_store",
        [
            (
                '    return {"store": dist.PrefixStore(f"shardcore/attempt-{attempt}", agent),',
                '    return {"store": agent,',
            )
        ],
        "tests/test_core_consistency.py::test_a_job_torchrun_restarted_gets_store_keys_of_its_own[1]",
        "a restarted job's group used the shared store's keys",
    ),
    m(
        "layout-dp-innermost",
        "the mesh's coordinates counted with dp innermost: TP groups across nodes, not neighbours",
        "shardcore/distributed/layout.py",
        "ParallelLayout.coordinates",
        [("        for d in reversed(DIMS):", "        for d in DIMS:")],
        "tests/test_core_config.py::test_layout_in_one_process",
        "rank 1 of dp2 x pp2 x tp2 sits at",
        fast=True,
    ),
    m(
        "audit-deaf-to-host-syncs",
        "the wrapper's barriers and object collectives never reach the sync audit's listeners",
        "shardcore/distributed/audit.py",
        "host_sync",
        [("        listener(kind)", "        pass")],
        "tests/test_core_sync.py::test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device",
        "the sync audit heard []",
    ),
    m(
        "audit-device-blind",
        "the device-strict audit lets any tensor through (a CPU buffer on an NCCL group passes)",
        "shardcore/distributed/audit.py",
        "check_device",
        [("    if STRICT and tensor.device != STRICT[-1]:", "    if False:")],
        "tests/test_core_sync.py::test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device",
        "the device-strict audit let a tensor on meta reach all_reduce: refused 'nothing'",
    ),
    m(
        "ring-turned-around",
        "a ring step sends to the previous rank and receives from the next (blocks arrive in the reverse order)",
        "shardcore/distributed/ring.py",
        "start_ring_shift",
        [
            (
                "dist.P2POp(dist.isend, x, peer(rank + 1), group), dist.P2POp(dist.irecv, received, peer(rank - 1), group)",
                "dist.P2POp(dist.isend, x, peer(rank - 1), group), dist.P2POp(dist.irecv, received, peer(rank + 1), group)",
            )
        ],
        "tests/test_core_ring.py::test_ring_attention_equals_full_attention[causal-4-fused]",
        "ring attention differs from full attention",
    ),
    m(
        "group-key-one-for-all",
        "every real process group gets the same cache key: the gradient norm sums the pipeline and tensor groups as one",
        "shardcore/distributed/ranks.py",
        "group_key",
        [("    return tuple(group_ranks(group))", "    return (0,)")],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_clip_grad_norm_matches_unsharded",
        "clip_grad_norm_ (torch, norm_type=2) on rank 0: norm 2.296",
    ),
    m(
        "replica-groups-interleaved",
        "the replica sub-groups of a tensor-parallel group are cut round robin, not into the consecutive ranks that hold one head",
        "shardcore/distributed/groups.py",
        "prepare_replica_groups",
        [("list(tp[b : b + blocks]) for tp in", "list(tp[b // blocks :: len(tp) // blocks]) for tp in")],
        "tests/integration/test_llama_clipping.py::test_torch_clip_grad_norm_is_the_unsharded_norm[4]",
        "clip_grad_norm_ (torch, norm_type=2) on rank 0: norm 3.346",
    ),
    m(
        "objects-barrier-unheard",
        "the wrapper's barrier blocks the host without telling the sync audit",
        "shardcore/distributed/objects.py",
        "barrier",
        [
            (
                '        _blocking("barrier", where)\n        work = dist.barrier(group=group, async_op=True)',
                "        work = dist.barrier(group=group, async_op=True)",
            )
        ],
        "tests/test_core_sync.py::test_the_audits_hear_the_wrapper_host_syncs_and_refuse_a_tensor_off_the_model_s_device",
        "the sync audit heard ['all_gather_object']",
    ),
    m(
        "pool-drops-rank-errors",
        "the rank pool takes a rank's exception for its result: a call that failed on every rank returns",
        "shardcore/distributed/launcher.py",
        "RankPool._run",
        [
            (
                '                if status == "err":\n                    errors[rank] = value',
                "                if False:\n                    errors[rank] = value",
            )
        ],
        "tests/test_core_parallelize.py::test_worker_exception_on_every_rank_keeps_the_handle",
        "DID NOT RAISE",
    ),
    m(
        "worker-hides-tracebacks",
        "a rank reports that it failed but not its traceback",
        "shardcore/distributed/worker.py",
        "main",
        [
            (
                '            payload = pickle.dumps(("err", traceback.format_exc()))',
                '            payload = pickle.dumps(("err", "a rank failed"))',
            )
        ],
        "tests/test_core_parallelize.py::test_worker_exception_on_every_rank_keeps_the_handle",
        "Regex pattern did not match",
    ),
    m(
        "exit-works-not-kept",
        "the works of shardcore's last collectives are not kept: a worker thread may destroy one at exit",
        "shardcore/distributed/retain.py",
        "retain",
        [
            (
                "        _KEPT.setdefault(group_key(group), collections.deque(maxlen=KEEP)).append(work)\n",
                "        pass\n",
            )
        ],
        "tests/test_core_exit.py::test_the_last_works_of_each_group_are_kept_and_bounded",
        "kept works per group: [0, 0",
    ),
    m(
        "exit-works-kept-forever",
        "every work shardcore waits for is kept, not the last few per group: memory grows with the steps",
        "shardcore/distributed/retain.py",
        "retain",
        [("collections.deque(maxlen=KEEP)", "collections.deque()")],
        "tests/integration/test_llama_long_run.py::test_a_long_run_stays_flat[tp2]",
        "resident memory grew",
    ),
    m(
        "watch-thread-not-joined-at-exit",
        "the watch's thread is left running into the interpreter's finalization (no exit hook)",
        "shardcore/distributed/watch.py",
        "Watch.enter",
        [("                atexit.register(self.stop)\n", "                pass\n")],
        "tests/test_core_exit.py::test_the_watch_s_thread_is_joined_before_the_interpreter_finalizes",
        "the watch's exit hook is not registered once",
    ),
    m(
        "exit-groups-not-settled",
        "the exit hook settles no gloo group: the script's and FSDP's last works are left to the worker threads",
        "shardcore/distributed/retain.py",
        "settle_at_exit",
        [("    for group in _gloo_groups():\n", "    for group in []:\n")],
        "tests/test_core_exit.py::test_the_exit_hook_settles_every_gloo_group_with_a_kept_barrier",
        "the exit barrier settled {'settled': 0",
    ),
    m(
        "given-mesh-coordinates-as-if-tp-innermost",
        "a layout read from a caller's mesh places each rank as if TP were the innermost dim (the mesh's rank grid ignored)",
        "shardcore/distributed/layout.py",
        "ParallelLayout.coordinates",
        [("        if self.ranks is not None:\n            rank = self.ranks.index(rank)\n", "")],
        "tests/test_core_given_mesh.py::test_fsdp_and_ddp_by_tp_on_a_mesh_with_tp_outermost[ddp]",
        # the kit feeds a rank the batch part of the dp place it was given: a TP group's ranks get different
        # batches, which the input check names before any step
        Raised("InputMismatch", "shardcore/consistency.py::check_inputs"),
    ),
    m(
        "given-mesh-groups-built-again",
        "the layout read from a caller's mesh builds its own groups beside the mesh's instead of using them",
        "shardcore/distributed/given_mesh.py",
        "view_of_mesh",
        [("given.mesh.get_group(name) if name is not None else _own_group(grid, i)", "_own_group(grid, i)")],
        "tests/test_core_given_mesh.py::test_tp_zero_config_on_the_callers_mesh",
        "'own': {'tensor': False}",
    ),
    m(
        "given-mesh-sizes-unchecked",
        "a size set in ShardConfig that contradicts the caller's mesh is not refused (the mesh silently wins)",
        "shardcore/distributed/given_mesh.py",
        "_check_sizes",
        [("        if given is not None and given != sizes[degree]", "        if False and given != sizes[degree]")],
        "tests/test_core_given_mesh.py::test_a_mesh_contradicting_the_config_is_refused_by_name_before_any_collective[mesh0-fields0-the mesh gives tp=4 (its 'tensor' dim) but tensor_parallel_size=2]",
        "not refused by name: no error",
    ),
    m(
        "given-mesh-shard-size-unfilled",
        "HSDP on a caller's mesh is not told the mesh's dp_shard size",
        "shardcore/distributed/given_mesh.py",
        "completed_config",
        [("data_parallel_shard_size=shard)", "data_parallel_shard_size=None)")],
        "tests/test_core_given_mesh.py::test_hsdp_on_the_meshs_replicate_and_shard_dims",
        "give a data_parallel_shard_size that divides 4",
    ),
]
