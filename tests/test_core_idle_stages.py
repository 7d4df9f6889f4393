"""The idle run on pipeline stages (``shardcore.data_parallel.idle``): the modules above ``at`` that take the
input by name are where a first stage notes it; a run with none is refused by name on every rank."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardcore.data_parallel import stage_takers
from shardcore.spec import IdleRun


class _Taker(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.language_model = nn.Linear(2, 2)

    def forward(self, input_ids=None, pixel_values=None):
        return self.language_model(torch.zeros(1, 2))


class _Blind(_Taker):
    def forward(self, **kwargs):  # takes the input, but not by name
        return self.language_model(torch.zeros(1, 2))


class _Top(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.model = inner


def test_the_stage_notes_the_input_where_a_module_takes_it_by_name():
    top = _Top(_Taker())
    runs = {"pixel_values": IdleRun("model.language_model", lambda m: torch.zeros(1))}
    assert stage_takers(top, runs) == [top.model]
    with pytest.raises(NotImplementedError, match=r"no module above 'model\.language_model' takes 'pixel_values'"):
        stage_takers(_Top(_Blind()), runs)
