"""examples/speech_generation.py, the lines docs/quickstart.md shows, on 2 ranks: Whisper's beam
search from synthesized audio gives the unsharded model's tokens."""

from __future__ import annotations

import pathlib

from shardcore.testing import example_main, run_on_ranks

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "speech_generation.py"


def _run(args: list[str]) -> list[list[int]]:
    return example_main(EXAMPLE)(args)


def test_the_speech_example_generates_the_unsharded_tokens():
    want = _run(["--unsharded"])
    assert len(want[0]) > 3, want  # it generated
    for tokens in run_on_ranks(2, _run, ["--tp", "2"]):
        assert tokens == want
