"""``explain --auto``'s search shares one paper build among the layouts that differ only in ``pp``,
``dp`` and the data-parallel engine: each layout's facts from that shared build equal the facts of its
own build, and the parts that depend on ``pp`` or ``dp`` equal what ``explain`` reports for the
layout on a build of its own (stage bytes, sequence and expert traffic per data-parallel rank's
tokens). A tiny Mixtral (4 experts, 4 heads, 2 key/value heads, 2 layers) over 8 ranks covers
tensor, pipeline, sequence (both modes) and expert parallelism."""

from __future__ import annotations

import copy

from moe_cases import build

import shardcore
from shardcore.cost import candidates
from shardcore.cost.copies import module_copy
from shardcore.cost.search import sp_traffic, workload_facts
from shardcore.explain import ExplainError, explain_on_paper

SEQ, BATCH, WORLD = 16, 8, 8


def _meta_mixtral():
    with shardcore.init_empty():
        return build("mixtral", output_router_logits=False)  # its balance loss is refused under pp and sp


def test_shared_paper_builds_give_each_layout_the_facts_of_its_own_build():
    model = _meta_mixtral()
    shared, compared, kinds = {}, 0, set()
    for layout in candidates(WORLD, batch=BATCH, seq=SEQ, blocks=2, experts=4):
        try:
            facts = workload_facts(model, layout, seq=SEQ, batch=BATCH, built=shared, tp_cache={})
        except (ExplainError, NotImplementedError, ValueError):
            continue
        own = workload_facts(model, layout, seq=SEQ, batch=BATCH, tp_cache={})  # a build of its own
        assert facts == own, f"{layout}: the shared build's facts differ from the layout's own build's"
        kw = {k: layout[k] for k in ("pp", "sp", "ep", "dp")}
        report, _, _ = explain_on_paper(
            copy.deepcopy(model), layout["tp"], seq=SEQ, batch=BATCH // layout["dp"], **kw,
            config=shardcore.cost.shard_config(layout),
        )  # fmt: skip
        if layout["pp"] > 1:  # the stages' bytes as explain splits them
            held = [s.dense_bytes + s.expert_bytes for s in facts["stages"]]
            assert held == report["pipeline_stage_bytes"], (
                f"{layout}: stage bytes {held}, explain's report {report['pipeline_stage_bytes']}"
            )
        want_sp = sp_traffic(report["sequence"], layout) if layout["sp"] > 1 else None
        assert facts["sp"] == want_sp, f"{layout}: sequence traffic {facts['sp']}, explain's report {want_sp}"
        sent = (report["experts"] or {}).get("all_to_all_bytes_per_layer")
        want_ep = (5, sent["forward"] + sent["backward"]) if sent else None
        assert facts.get("ep") == want_ep, f"{layout}: expert traffic {facts.get('ep')}, explain's report {want_ep}"
        compared += 1
        kinds |= {k for k in ("pp", "sp", "ep", "dp") if layout[k] > 1} | {layout["mode"]}
    assert compared >= 20 and {"pp", "sp", "ep", "dp", "all_to_all", "ring_attn"} <= kinds, (compared, kinds)
    assert len(shared) < compared, f"{len(shared)} paper builds for {compared} layouts: none shared"


def test_a_module_copy_is_a_deep_copy_the_sharding_leaves_the_original_untouched():
    model = _meta_mixtral()
    copied = module_copy(model)
    want = {n: (p.shape, p.dtype, p.requires_grad) for n, p in copy.deepcopy(model).named_parameters()}
    assert {n: (p.shape, p.dtype, p.requires_grad) for n, p in copied.named_parameters()} == want
    assert [n for n, _ in copied.named_buffers()] == [n for n, _ in model.named_buffers()]
    originals = {id(x) for x in (*model.parameters(), *model.buffers(), *model.modules(), model.config)}
    mine = (*copied.parameters(), *copied.buffers(), *copied.modules(), copied.config)
    assert not any(id(x) in originals for x in mine), "the copy shares an object with the model"
    assert copied.model.layers[0].self_attn.config is copied.config  # one config, shared as in the model
    before = {n: p.shape for n, p in model.named_parameters()}
    explain_on_paper(copied, 2)  # shards the copy in place
    assert {n: p.shape for n, p in model.named_parameters()} == before
