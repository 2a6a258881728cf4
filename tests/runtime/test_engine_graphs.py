"""Graph dispatch on CPU: grid selection, budget, refusals, eager counting, no capture after
warm-up; and the engine's graph path (static buffers, padded batch and frames, packed setup
solves) against the reference's PCM, with a capture backend that runs eagerly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from minicpm_speech_runtime.bench.parity import (
    TOL,
    drain,
    engine,
    fixed_nsf_noise,
    make_voices,
    max_diff,
    reference_chunks,
    small_models,
    utterance,
)
from minicpm_speech_runtime.bench.reference_driver import ReferenceDriver
from minicpm_speech_runtime.engine.graphs import (
    Body,
    EagerBackend,
    GraphDispatcher,
    GraphKey,
    batch_grid,
)


class FakeBackend(EagerBackend):
    def __init__(self, fail: set[int] | None = None) -> None:
        self.captured: list[Any] = []
        self.fail = fail or set()

    def capture(self, body: Body) -> Body:
        if len(self.captured) in self.fail:
            self.captured.append(None)
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captured.append(body())
        return body


def _dispatcher(budget: int = 64, **kw: Any) -> tuple[GraphDispatcher, list[str]]:
    d = GraphDispatcher(budget, FakeBackend(**kw))
    idles: list[str] = []
    for b in (1, 2, 4, 8):
        for f in (50, 56):
            key = GraphKey("decode", b, f)
            d.declare(key, lambda key=key: key, lambda: idles.append("idle"))
    return d, idles


def test_batch_grid() -> None:
    assert batch_grid(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_grid(6) == [1, 2, 4, 6]
    assert batch_grid(1) == [1]


def test_select_smallest_fitting_key() -> None:
    d, _ = _dispatcher()
    assert d.select("decode", 3, 50) == GraphKey("decode", 4, 50)
    assert d.select("decode", 3, 51) == GraphKey("decode", 4, 56)
    assert d.select("decode", 8, 2) == GraphKey("decode", 8, 50)
    assert d.counters.eager["decode"] == 0
    assert d.select("decode", 9, 50) is None  # off the grid: eager, counted
    assert d.select("decode", 1, 57) is None
    assert d.select("setup", 1, 10) is None
    assert d.counters.eager == {"decode": 2, "setup": 1}


def test_disabled_dispatcher_selects_nothing_and_counts_nothing() -> None:
    d = GraphDispatcher(64, None)
    d.declare(GraphKey("decode", 1, 50), lambda: None, lambda: None)
    assert not d.grid and d.select("decode", 1, 50) is None
    assert d.stats()["eager"] == {} and d.precapture(("decode",)) == 0


def test_precapture_largest_first_within_budget() -> None:
    d, idles = _dispatcher(budget=5)
    assert d.precapture(("decode",)) == 5
    assert [k.batch for k in d.graphs] == [8, 8, 4, 4, 2]
    assert d.counters.refusals == 3 and d.budget_used == 5
    assert len(idles) == 10  # buffers idle before and after every capture
    # refused keys left the grid: the next larger captured key serves their shapes
    assert d.select("decode", 1, 50) == GraphKey("decode", 2, 56)  # (2, 50) was refused
    assert d.replayer(GraphKey("decode", 2, 56)) is not None
    assert d.replayer(GraphKey("decode", 1, 50)) is None  # refused before: eager, counted
    assert d.counters.replays == 1 and d.counters.eager["decode"] == 1


def test_failed_capture_is_a_counted_refusal() -> None:
    d, _ = _dispatcher(fail={0})
    d.precapture(("decode",))
    # a failed capture may leave the allocator unusable: no further captures, all eager
    assert d.counters.refusals == 1 and not d.graphs and not d.enabled
    assert "capture failed" in d.stats()["errors"]["decode/8/56/0"]
    assert d.select("decode", 8, 56) is None and d.select("decode", 1, 50) is None


def test_lazy_capture_after_warmup_is_counted() -> None:
    d, _ = _dispatcher()
    d.warm = True
    replay = d.replayer(GraphKey("decode", 2, 50))
    assert replay is not None and replay() == GraphKey("decode", 2, 50)
    assert d.counters.captures == d.counters.captures_after_warmup == 1
    d.replayer(GraphKey("decode", 2, 50))
    assert d.counters.captures == 1 and d.counters.replays == 2


@pytest.fixture(scope="module")
def setup(models):  # type: ignore[no-untyped-def]
    small = small_models(models)
    return small, make_voices(small, [2.0, 3.3, 5.6])


def test_graph_path_parity_and_no_capture_after_warmup(setup) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup
    # b and e end on one step with last chunks of one length: two rows of one tail graph
    plan = [("a", 0, 160, 0), ("b", 1, 53, 0), ("c", 2, 90, 1), ("d", 0, 30, 3),
            ("e", 2, 53, 0)]
    with fixed_nsf_noise():
        driver = ReferenceDriver(small)
        want = {
            sid: reference_chunks(driver, sid, voices[v], utterance(n, i))
            for i, (sid, v, n, _) in enumerate(plan)
        }
        eng = engine(small, max_streams=5, micro_batch=3, graph_budget=48)
        eng = type(eng)(small, eng.config, graph_backend=FakeBackend())
        captured = eng.warmup()
        got: dict[Any, list[np.ndarray]] = {}
        reasons: dict[Any, str] = {}
        for step in drain(eng, got, reasons, min_steps=4):
            for i, (sid, v, n, at) in enumerate(plan):
                if at == step:
                    eng.add_stream(sid, voices[v])
                    eng.push_tokens(sid, utterance(n, i), last=True)
    stats = eng.graph_stats()
    # decode 4 sizes x 2 buckets, HiFT 4 sizes x (first chunk, later chunks), packed setup
    # widths 256, 512, 768 and 900 (3 prompts of 300 frames), and a one-row HiFT graph for
    # each length a last chunk can have (1 to 28 tokens, but 25: a continuing chunk's shape):
    # nothing runs eager
    assert captured == stats["graphs"] == 8 + 8 + 4 + 27
    assert stats["eager"] == {}
    assert stats["replays"] > 0 and stats["captures_after_warmup"] == 0 and stats["refusals"] == 0
    assert stats["replays"] > 0
    for sid, *_ in plan:
        assert reasons[sid] == "done"
        assert max_diff(want[sid], got[sid]) <= TOL, sid


def test_graph_safe_istft_matches_torch() -> None:
    from minicpm_speech_runtime.engine.vocoder import _istft

    window = torch.hann_window(16, periodic=True)
    mag, phase = torch.rand(3, 9, 40) * 3, torch.randn(3, 9, 40)
    spec = torch.complex(mag * torch.cos(phase), mag * torch.sin(phase))
    want = torch.istft(spec, 16, 4, 16, window=window)
    got = _istft({"n_fft": 16, "hop_len": 4}, window, mag, phase)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) < 1e-5


def test_continuing_chunks_of_many_streams_are_one_hift_replay(setup) -> None:  # type: ignore[no-untyped-def]
    """Four streams' continuing chunks (8 cached + 50 new frames) are one batched HiFT graph
    replay; four last chunks, of four lengths, are one one-row replay each."""
    from minicpm_speech_runtime.engine.vocoder import (
        MEL_CACHE,
        SOURCE_CACHE,
        BatchedVocoder,
        VocoderCache,
    )

    small, _ = setup
    d = GraphDispatcher(64, FakeBackend())
    voc = BatchedVocoder(small.hift, torch.device("cpu"), d, [1, 2, 4])
    d.precapture(("hift", "hift_tail"))
    d.warm = True

    def caches(n: int) -> list[VocoderCache]:
        return [VocoderCache(torch.randn(80, MEL_CACHE), torch.randn(1, SOURCE_CACHE) * 0.1,
                             torch.randn(SOURCE_CACHE) * 0.1) for _ in range(n)]

    with fixed_nsf_noise():
        voc.run([torch.randn(80, 50) for _ in range(4)], caches(4), [False] * 4)
        assert (d.counters.replays, dict(d.counters.eager)) == (1, {})
        voc.run([torch.randn(80, 2 * r) for r in (3, 9, 17, 28)], caches(4), [True] * 4)
    assert (d.counters.replays, dict(d.counters.eager)) == (5, {})
