"""``shardcore check`` on a Mixtral at EP=2 x TP=2 over DDP (4 gloo ranks): the card passes with the
experts and router compared as a part, the tokens' all-to-alls counted among the collectives; the
clipped norm is a row of its own, so a norm not reduced over the experts' axis fails it by name."""

from __future__ import annotations

from moe_cases import build, lm_batch

import shardcore
from shardcore import ShardConfig


def mixtral():
    return build("mixtral")


def test_the_card_of_mixtral_at_ep2_x_tp2_passes_with_the_experts_compared():
    config = ShardConfig(tensor_parallel_size=2, expert_parallel_size=2, data_parallel="ddp", data_parallel_size=2)
    card = shardcore.check(mixtral, config, batch=lm_batch(batch=4, seq=16))
    print("\n" + card.format())
    rows = {r.what: r for r in card.rows}
    assert card.layout == "dp2 (ddp) x ep2 x tp2" and card.world == 4
    assert "gradients: experts and router" in rows and rows["gradients: experts and router"].passed, card.format()
    assert card.passed, card.format()
    assert card.collectives["all_to_all"] == [card.collectives["all_to_all"][0]] * 4 > [0] * 4, card.collectives
