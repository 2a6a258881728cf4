"""Bad input and faults: the stream ends with a clear reason, the others are unaffected, and
slots, caches and stream tables return to their baseline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from minicpm_speech_runtime.bench.parity import (
    TOL,
    drain,
    engine,
    fixed_nsf_noise,
    make_voices,
    max_diff,
    small_models,
    utterance,
)


@pytest.fixture(scope="module")
def setup(models):  # type: ignore[no-untyped-def]
    small = small_models(models)
    return small, make_voices(small, [2.0, 3.0])


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _baseline(eng: Any) -> None:
    assert eng.num_streams == 0 and eng.runner.num_live == 0
    assert not eng.runner.streams and all(o is None for o in eng.runner.owner)
    assert not eng.scheduler.cancelled


def _run(small: Any, voices: Any, extra: Any = None, clock: Any = None) -> tuple[dict, dict, Any]:
    eng = engine(small)
    if clock is not None:
        eng.clock = clock
    for i in range(2):
        eng.add_stream(f"ok{i}", voices[i])
        eng.push_tokens(f"ok{i}", utterance(60 + 20 * i, i), last=True)
    if extra is not None:
        extra(eng)
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    for step in drain(eng, got, reasons):
        if clock is not None:
            clock.now = 100.0 * (step + 1)
    return got, reasons, eng


def test_bad_inputs_end_only_their_stream(setup) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup

    def bad(eng: Any) -> None:
        eng.add_stream("bad", voices[0])
        eng.push_tokens("bad", [1, 2, 9999])
        eng.add_stream("empty", voices[1])
        eng.push_tokens("empty", [], last=True)

    with fixed_nsf_noise():
        base, _, _ = _run(small, voices)
        got, reasons, eng = _run(small, voices, bad)
    assert reasons["bad"].startswith("token-out-of-range: token 9999")
    assert reasons["empty"] == "empty"
    for sid in ("ok0", "ok1"):
        assert reasons[sid] == "done" and max_diff(base[sid], got[sid]) == 0.0
    _baseline(eng)


def test_idle_stream_times_out(setup) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup

    def idle(eng: Any) -> None:
        eng.add_stream("idle", voices[1])
        eng.push_tokens("idle", utterance(40, 9))  # never sends its last chunk

    with fixed_nsf_noise():
        got, reasons, eng = _run(small, voices, idle, clock=FakeClock())
    assert reasons["idle"] == "idle-timeout"
    assert len(got["idle"]) == 1  # the one full chunk it had was still decoded
    _baseline(eng)


def test_cancel_mid_solve(setup) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup
    with fixed_nsf_noise():
        base, _, _ = _run(small, voices)
        eng = engine(small)
        solve = eng.runner.estimator.solve
        calls = {"n": 0}

        def cancelling_solve(inputs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 2:  # the second decode step (setups solve in the scratch)
                eng.cancel("victim")
            return solve(inputs)

        eng.runner.estimator.solve = cancelling_solve  # type: ignore[method-assign]
        for i in range(2):
            eng.add_stream(f"ok{i}", voices[i])
            eng.push_tokens(f"ok{i}", utterance(60 + 20 * i, i), last=True)
        eng.add_stream("victim", voices[0])
        eng.push_tokens("victim", utterance(90, 5), last=True)
        got: dict[Any, list[np.ndarray]] = {}
        reasons: dict[Any, str] = {}
        for _ in drain(eng, got, reasons):
            pass
    assert reasons["victim"] == "cancelled" and len(got.get("victim", [])) == 1
    for sid in ("ok0", "ok1"):
        assert max_diff(base[sid], got[sid]) <= TOL
    assert eng.counters.ended["cancelled"] == 1
    _baseline(eng)


def test_voices_the_engine_cannot_set_up_are_refused_before_any_step(setup) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    small, voices = setup
    eng = engine(small, max_prompt_frames=120)
    good = voices[0]  # 2.0 s: 100 frames
    frames = int(good.prompt_mels.shape[1])
    shorter = dataclasses.replace(good, key="cut", prompt_mels=good.prompt_mels[:, : frames - 2])
    with pytest.raises(ValueError, match=r"prompt_mels: 98 frames for 50 prompt tokens"):
        eng.add_stream("cut", shorter)
    with pytest.raises(ValueError, match=r"prompt_mels: 150 frames > max_prompt_frames \(120\)"):
        eng.add_stream("long", voices[1])
    one_token = dataclasses.replace(
        good, key="one", prompt_tokens=good.prompt_tokens[:, :1],
        prompt_mels=good.prompt_mels[:, : eng.up_rate],
    )
    with pytest.raises(ValueError, match=r"2 frames for 1 prompt tokens; .* at least 2 tokens"):
        eng.add_stream("one", one_token)
    _baseline(eng)
    eng.add_stream("ok", good)  # the engine serves on
    eng.push_tokens("ok", utterance(30, 1), last=True)
    out: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    for _ in drain(eng, out, reasons):
        pass
    assert reasons == {"ok": "done"}
    _baseline(eng)


def test_a_stream_whose_audio_turns_non_finite_ends_alone_and_leaves_its_slot_clean(setup) -> None:  # type: ignore[no-untyped-def]
    """A NaN in one stream's caches (as an overflow in a narrow precision would leave) ends
    that stream with a counted reason; the others decode as if it never happened, and a new
    stream that takes its slot starts clean."""
    import torch

    small, voices = setup

    def run(poison: bool) -> tuple[dict, dict, Any]:  # type: ignore[type-arg]
        eng = engine(small, max_streams=4)
        decode = eng.runner.decode

        def poisoning_decode(batch: Any) -> Any:
            victim = eng.scheduler.streams.get("victim")
            if poison and victim is not None and not eng.counters.chunks:
                frames = eng.runner.streams["victim"].pool_frames
                eng.runner.estimator.k[:, :, frames] = float("nan")
            return decode(batch)

        eng.runner.decode = poisoning_decode  # type: ignore[method-assign]
        for i in range(2):
            eng.add_stream(f"ok{i}", voices[i])
            eng.push_tokens(f"ok{i}", utterance(120 + 20 * i, i), last=True)
        eng.add_stream("victim", voices[1])
        eng.push_tokens("victim", utterance(90, 5), last=True)
        got: dict[Any, list[np.ndarray]] = {}
        reasons: dict[Any, str] = {}
        for step in drain(eng, got, reasons):
            if step == 3:
                eng.add_stream("next", voices[0])
                eng.push_tokens("next", utterance(40, 7), last=True)
        return got, reasons, eng

    with fixed_nsf_noise():
        base, base_reasons, _ = run(poison=False)
        got, reasons, eng = run(poison=True)
    assert base_reasons["victim"] == "done"
    assert reasons["victim"] == "non-finite: its decoded audio held NaN or Inf"
    assert "victim" not in got  # no NaN reaches a listener
    assert eng.counters.ended["non-finite"] == 1
    for sid in ("ok0", "ok1", "next"):
        assert reasons[sid] == "done"
        assert all(np.isfinite(c).all() for c in got[sid]), sid
        assert max_diff(base[sid], got[sid]) <= TOL, sid
    assert not torch.isnan(eng.runner.estimator.k).any()  # its frames were cleared
    _baseline(eng)


def test_a_set_up_voice_whose_stream_turned_non_finite_is_solved_again(setup) -> None:  # type: ignore[no-untyped-def]
    """A kept set-up that holds a NaN (a prompt's solve that overflowed) would end every later
    stream of its voice: the first such stream drops it, and the next one solves it afresh."""
    import torch

    small, voices = setup
    with fixed_nsf_noise():
        eng = engine(small)
        results: dict[str, str] = {}
        audio: dict[Any, list[np.ndarray]] = {}

        def one(sid: str) -> None:
            eng.add_stream(sid, voices[1])
            eng.push_tokens(sid, utterance(40, 3), last=True)
            for _ in drain(eng, audio, results):
                pass

        one("first")  # solves the voice's set-up and keeps it
        entry = eng.runner.setup_cache.entries[voices[1].key]
        with torch.inference_mode():  # as an overflow in the solve would leave it
            entry.k.view(-1)[:8] = float("nan")
        one("from-poisoned-cache")
        assert voices[1].key not in eng.runner.setup_cache
        one("solved-again")
        one("from-fresh-cache")
    assert results["first"] == "done"
    assert results["from-poisoned-cache"] == "non-finite: its decoded audio held NaN or Inf"
    assert results["solved-again"] == results["from-fresh-cache"] == "done"
    assert max_diff(audio["first"], audio["solved-again"]) <= TOL
    assert max_diff(audio["first"], audio["from-fresh-cache"]) <= TOL
    assert not torch.isnan(eng.runner.setup_cache.entries[voices[1].key].k).any()
    _baseline(eng)


def test_a_voice_holding_nan_is_refused_before_it_joins_a_setup(setup) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    small, voices = setup
    eng = engine(small)
    for name in ("prompt_mels", "spk_emb"):
        bad = getattr(voices[0], name).clone()
        bad.view(-1)[3] = float("inf") if name == "spk_emb" else float("nan")
        with pytest.raises(ValueError, match=f"voice {name}: holds NaN or Inf"):
            eng.add_stream(name, dataclasses.replace(voices[0], key=name, **{name: bad}))
    _baseline(eng)
