"""Batched engine PCM == the reference's per-stream ``Token2wav.stream``, fp32, TF32 off.

Voices of 2.0-5.6 s (100-280 prompt frames), shared and distinct; utterances of 5-260 tokens
(one chunk to ten, past the 100-frame history window); streams joining and leaving mid-flight;
setup groups split by the micro-batch.
"""

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


@pytest.fixture()
def nsf():  # type: ignore[no-untyped-def]
    with fixed_nsf_noise():
        yield


@pytest.fixture(scope="module")
def setup(models):  # type: ignore[no-untyped-def]
    small = small_models(models)
    return small, make_voices(small, [2.0, 3.3, 5.6])


def test_mixed_streams_join_and_leave(setup, nsf) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup
    plan = [  # (stream, voice, tokens, joins at step)
        ("a", 0, 260, 0),
        ("b", 1, 77, 0),
        ("c", 0, 5, 1),
        ("d", 2, 130, 2),
        ("e", 1, 53, 4),
    ]
    driver = ReferenceDriver(small)
    want = {
        sid: reference_chunks(driver, sid, voices[v], utterance(n, i))
        for i, (sid, v, n, _) in enumerate(plan)
    }
    eng = engine(small)
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    for step in drain(eng, got, reasons, min_steps=5):
        for i, (sid, v, n, at) in enumerate(plan):
            if at == step:
                eng.add_stream(sid, voices[v])
                eng.push_tokens(sid, utterance(n, i), last=True)
    for sid, *_ in plan:
        assert reasons[sid] == "done"
        assert max_diff(want[sid], got[sid]) <= TOL, sid
    assert eng.counters.ended["done"] == len(plan)
    assert eng.runner.num_live == 0
    # as streams left, a stream beyond the smaller graph moved down: its PCM held across the move
    assert eng.runner.slot_moves >= 1


def test_tokens_arriving_in_pieces_and_setup_groups(setup, nsf) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup
    sids = [f"s{i}" for i in range(5)]
    toks = {sid: utterance(40 + 9 * i, 10 + i) for i, sid in enumerate(sids)}
    driver = ReferenceDriver(small)
    want = {
        sid: reference_chunks(driver, sid, voices[i % 3], toks[sid]) for i, sid in enumerate(sids)
    }
    eng = engine(small, micro_batch=2)
    for i, sid in enumerate(sids):
        eng.add_stream(sid, voices[i % 3])
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    sent = dict.fromkeys(sids, 0)
    for _ in drain(eng, got, reasons):
        for sid in sids:  # 7 tokens per stream per step, the last flag with the final piece
            if sid in eng.scheduler.streams and sent[sid] < len(toks[sid]):
                piece = toks[sid][sent[sid] : sent[sid] + 7]
                sent[sid] += len(piece)
                eng.push_tokens(sid, piece, last=sent[sid] >= len(toks[sid]))
    # voices 0, 1, 2 solved cold in groups of 2; the second streams of voices 0 and 1 copy
    c = eng.counters
    assert (c.setup_groups, c.setups, c.setup_shared, c.setup_hits) == (2, 3, 2, 0)
    for sid in sids:
        assert max_diff(want[sid], got[sid]) <= TOL, sid


def test_setup_cache_hits_and_eviction_keep_pcm(setup, nsf) -> None:  # type: ignore[no-untyped-def]
    """A later stream of a set-up voice starts from the cache; a cold setup in the same step
    that evicts that entry (room for one voice) cannot take it away from the hit."""
    small, voices = setup
    # (stream, voice, tokens, step); voice 0's prompt is shorter than voice 1's
    plan = [("a", 1, 60, 0), ("b", 1, 45, 3), ("c", 0, 70, 3)]
    driver = ReferenceDriver(small)
    want = {
        sid: reference_chunks(driver, sid, voices[v], utterance(n, 20 + i))
        for i, (sid, v, n, _) in enumerate(plan)
    }
    eng = engine(small)
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    for step in drain(eng, got, reasons, min_steps=4):
        if step == 1:  # voice 1 is cached now: shrink the cache to exactly that entry
            cache = eng.runner.setup_cache
            assert voices[1].key in cache and len(cache) == 1
            cache.budget = cache.nbytes + 1
        for i, (sid, v, n, at) in enumerate(plan):
            if at == step:
                eng.add_stream(sid, voices[v])
                eng.push_tokens(sid, utterance(n, 20 + i), last=True)
    c, cache = eng.counters, eng.runner.setup_cache
    assert (c.setups, c.setup_hits, c.setup_shared) == (2, 1, 0)
    assert cache.evictions == 1 and voices[1].key not in cache and voices[0].key in cache
    for sid, *_ in plan:
        assert reasons[sid] == "done"
        assert max_diff(want[sid], got[sid]) <= TOL, sid


def test_setup_cache_off_solves_every_stream(setup, nsf) -> None:  # type: ignore[no-untyped-def]
    """With the cache off, two streams of one voice set up in one step still share one solve:
    the second starts from an exact copy of the first's caches, and both match the reference.

    The copy is compared right after the setup step, where it is bit-exact by construction.
    Their PCM is not compared with each other exactly: the two streams decode as two rows of
    one batched solve, and how a CPU kernel splits that batch across threads and SIMD lanes
    moves a row's last bits (1e-7 at 2 threads, 0 at 1)."""
    small, voices = setup
    eng = engine(small, setup_cache_mib=0)
    toks = utterance(30, 5)
    want = reference_chunks(ReferenceDriver(small), "x", voices[2], toks)
    for sid in ("x", "y"):
        eng.add_stream(sid, voices[2])
        eng.push_tokens(sid, toks[:10])  # no chunk ready: the step only sets up
    eng.step()
    x, y = (eng.scheduler.streams[sid] for sid in ("x", "y"))
    est, enc, p = eng.runner.estimator, eng.runner.encoder, x.prompt_frames
    rx, ry = (slice(2 * s.slot, 2 * s.slot + 2) for s in (x, y))  # two CFG rows per slot
    assert rx != ry and y.prompt_frames == p
    fx, fy = (eng.runner.prompt_frames_of(s) for s in (x, y))
    assert not set(fx.tolist()) & set(fy.tolist())  # copies, in frames of its own
    for kx, ky in zip(eng.runner.prompt_kv(x), eng.runner.prompt_kv(y), strict=True):
        assert torch.equal(kx, ky)
    assert torch.equal(est.conv[:, :, rx], est.conv[:, :, ry])
    ex, ey = (enc.export_state(eng.runner.streams[s].encoder, copy=False) for s in ("x", "y"))
    assert torch.equal(ex.att, ey.att) and torch.equal(ex.cnn, ey.cnn) and ex.length == ey.length
    for sid in ("x", "y"):
        eng.push_tokens(sid, toks[10:], last=True)
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    for _ in drain(eng, got, reasons):
        pass
    assert len(eng.runner.setup_cache) == 0
    c = eng.counters
    assert (c.setups, c.setup_shared, c.setup_hits) == (1, 1, 0)
    for sid in ("x", "y"):
        assert reasons[sid] == "done"
        assert max_diff(want, got[sid]) <= TOL, sid


def test_cold_setup_caches_equal_reference_setup_cache(setup) -> None:  # type: ignore[no-untyped-def]
    """Each cold voice's estimator caches (prompt keys, values, conv state) equal those of the
    reference's ``setup_cache`` for that voice alone, whatever was solved before it: groups of
    mixed prompt lengths, then a later group that reuses the same setup storage."""
    small, voices = setup
    more = make_voices(small, [2.6, 4.1, 1.5])
    every = [*voices, *more]
    driver = ReferenceDriver(small)
    for i, v in enumerate(every):
        driver.add(i, v)
    eng = engine(small, micro_batch=2, setup_cache_mib=0)
    waves = [[0, 1, 2], [3], [4, 5]]  # 2 groups, then 1 voice, then 1 group (sorted by length)
    est = eng.runner.estimator
    for wave in waves:
        for i in wave:
            eng.add_stream(i, every[i])
            eng.push_tokens(i, utterance(10, i))  # no chunk ready: the step only sets up
        eng.step()
        for i in wave:
            s = eng.scheduler.streams[i]
            p, rows = s.prompt_frames, slice(2 * s.slot, 2 * s.slot + 2)
            ref = driver.streams[i].stream_cache
            assert ref is not None
            # the reference's buffers hold more Euler steps than it uses
            att = ref["estimator_att_cache"][: est.steps]
            cnn = ref["estimator_cnn_cache"][: est.steps]
            d = est.head_dim
            assert att.shape[4] == p
            k, v = eng.runner.prompt_kv(s)  # [steps, depth, rows, heads, frames, head_dim]
            assert float((k - att[..., :d]).abs().max()) <= 1e-4, i
            assert float((v - att[..., d:]).abs().max()) <= 1e-4, i
            conv = est.conv[:, :, rows].transpose(-1, -2)
            assert float((conv - cnn).abs().max()) <= 1e-4, i
        for i in wave:
            eng.cancel(i)
        eng.step()
    assert eng.counters.setups == len(every)
