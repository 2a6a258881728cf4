"""Stream slots: a leaving stream moves no one while the slots in use fit the smallest decode
graph for that many streams; once they do not, the highest moves down (so a shrinking load
runs smaller solves). PCM across a move: ``test_engine_parity.py``."""

from __future__ import annotations

import pytest
from minicpm_speech_runtime.bench.parity import engine, make_voices, small_models


@pytest.fixture(scope="module")
def small_and_voice(models):  # type: ignore[no-untyped-def]
    small = small_models(models)
    return small, make_voices(small, [2.0])[0]


def _end(eng, *sids: str) -> None:  # type: ignore[no-untyped-def]
    for sid in sids:
        eng.cancel(sid)
    eng.step()


def test_a_leaving_stream_moves_no_one_and_its_slot_is_reused(small_and_voice) -> None:  # type: ignore[no-untyped-def]
    small, voice = small_and_voice
    eng = engine(small, max_streams=6)  # decode graphs of 1, 2, 4 and 6 streams
    for sid in "abcdef":
        eng.add_stream(sid, voice)
    slots = {sid: s.slot for sid, s in eng.scheduler.streams.items()}
    assert slots == dict(zip("abcdef", range(6), strict=True))
    _end(eng, "b")
    assert eng.runner.slot_moves == 0 and eng.scheduler.streams["f"].slot == 5
    eng.add_stream("g", voice)
    assert eng.scheduler.streams["g"].slot == 1  # the lowest free slot


def test_slots_past_the_smaller_graph_move_down(small_and_voice) -> None:  # type: ignore[no-untyped-def]
    small, voice = small_and_voice
    eng = engine(small, max_streams=6)
    for sid in "abcdef":
        eng.add_stream(sid, voice)
    _end(eng, "b", "c", "d")  # 3 left fit the 4-stream graph; e (slot 4) and f (5) did not
    assert {sid: s.slot for sid, s in eng.scheduler.streams.items()} == {"a": 0, "e": 2, "f": 1}
    assert eng.runner.slot_moves == 2
    _end(eng, "a", "e")  # a leaves: e moves into slot 0; e leaves: f moves into slot 0
    assert eng.scheduler.streams["f"].slot == 0 and eng.runner.slot_moves == 4
    assert eng.runner.owner[1:] == [None] * 5
